"""Position tokens: which offsets of a source topic a write reached, as opaque text.

A token names, for each partition a write went to, the offset *after* the last record
written there (the next offset): a replica whose applied offset of that partition is at
least this one holds the write. The text is base64url without padding, of a compact
binary form (integers are unsigned LEB128 varints):

====================  ==================================================================
version               1 byte (:data:`VERSION`)
app                   4 bytes: BLAKE2b of the app id; a token of another app is refused
topic                 1 byte length, then the topic name (UTF-8)
count                 varint: how many partitions
partitions            1 byte form, then either a bitmap (form 1: varint byte length,
                      little-endian bits) or ascending gaps (form 0: the first partition,
                      then each next one minus the previous minus one, as varints)
offsets               in partition order, frame of reference: varint base (the smallest),
                      1 byte bit width, then ``offset - base`` of each, bit-packed
                      little-endian
checksum              4 bytes: BLAKE2b of everything before it
====================  ==================================================================

The encoding is deterministic, so equal tokens have equal text.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from collections.abc import Collection
from dataclasses import dataclass

VERSION = 1
#: Text longer than this is refused unread: it is more than any 1,000-partition write
#: can need (see :func:`encode_token`).
MAX_TOKEN_CHARS = 18 * 1024
#: The length a token stays within in practice (CONTRACT.md: "at most 2 KiB").
TOKEN_BUDGET_CHARS = 2 * 1024
#: A token names at most this many partitions (a produce writes at most 1,000 records).
MAX_PARTITIONS = 1000
MAX_OFFSET = (1 << 63) - 1
MAX_PARTITION = (1 << 31) - 1

_APP_BYTES = 4
_CHECKSUM_BYTES = 4
_GAPS, _BITMAP = 0, 1
_BASE64URL = re.compile(r"[A-Za-z0-9_-]*")


@dataclass(frozen=True)
class Token:
    """The positions a write reached on one topic: partition -> the next offset there."""

    topic: str
    positions: dict[int, int]


class TokenError(ValueError):
    """A token that cannot be used. ``reason`` is one of ``not-base64url``, ``too-long``,
    ``bad-version``, ``malformed``, ``foreign`` or ``unknown-topic``; the message says
    more."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def encode_token(token: Token, app_id: str) -> str:
    """The token as URL-safe text. ValueError if it names more than
    :data:`MAX_PARTITIONS` partitions, or a partition or offset out of Kafka's range.

    Offsets are stored relative to the smallest one, so the text stays within
    :data:`TOKEN_BUDGET_CHARS` for 1,000 partitions whose offsets lie within 2,048 of
    each other, and for the 632 partitions that 1,000 randomly keyed records reach on
    a 1,000-partition topic when their offsets lie within 100,000 of each other.
    """
    positions = sorted(token.positions.items())
    _check(token.topic, positions)
    topic = token.topic.encode("utf-8")
    out = bytearray([VERSION])
    out += _app_hash(app_id)
    out.append(len(topic))
    out += topic
    out += _varint(len(positions))
    out += _partitions([p for p, _ in positions])
    out += _offsets([o for _, o in positions])
    out += _checksum(out)
    return base64.urlsafe_b64encode(bytes(out)).rstrip(b"=").decode("ascii")


def decode_token(text: str, app_id: str, *, topics: Collection[str]) -> Token:
    """The token that :func:`encode_token` made for ``app_id``, or TokenError.

    ``topics`` are the topics a token may name: those records are written to.
    """
    raw = _unbase64(text)
    if raw[0] != VERSION:
        raise TokenError(
            "bad-version",
            f"not a token this worker reads: it starts with version {raw[0]}, not {VERSION} "
            "(give the token a write through POST /topics/{topic}/records answered)",
        )
    if len(raw) < 1 + _APP_BYTES + _CHECKSUM_BYTES:
        raise TokenError("malformed", f"token of {len(raw)} bytes is too short to be one")
    body, checksum = raw[:-_CHECKSUM_BYTES], raw[-_CHECKSUM_BYTES:]
    if _checksum(body) != checksum:
        raise TokenError("malformed", "token checksum mismatch: the token was altered or cut")
    if body[1 : 1 + _APP_BYTES] != _app_hash(app_id):
        raise TokenError("foreign", f"the token was not issued by the app {app_id!r}")
    try:
        token = _Reader(body, 1 + _APP_BYTES).token()
    except (IndexError, ValueError) as error:  # only a forged checksum gets here
        raise TokenError("malformed", f"token body does not parse: {error}") from None
    if token.topic not in topics:
        shown = ", ".join(sorted(topics))
        raise TokenError("unknown-topic", f"token topic {token.topic!r} is not one of {shown}")
    return token


def _check(topic: str, positions: list[tuple[int, int]]) -> None:
    if not 0 < len(topic.encode("utf-8")) < 256:
        raise ValueError(f"a topic name of 1 to 255 bytes, not {topic!r}")
    if len(positions) > MAX_PARTITIONS:
        raise ValueError(f"{len(positions)} partitions; a token holds at most {MAX_PARTITIONS}")
    for partition, offset in positions:
        if not 0 <= partition <= MAX_PARTITION or not 0 <= offset <= MAX_OFFSET:
            raise ValueError(f"partition {partition} offset {offset} out of Kafka's range")


def _unbase64(text: str) -> bytes:
    if len(text) > MAX_TOKEN_CHARS:
        raise TokenError("too-long", f"token of {len(text)} characters, at most {MAX_TOKEN_CHARS}")
    if not text or not _BASE64URL.fullmatch(text) or len(text) % 4 == 1:
        raise TokenError("not-base64url", "a token is base64url text without padding")
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        raise TokenError("not-base64url", "a token is base64url text without padding") from None


def _app_hash(app_id: str) -> bytes:
    return hashlib.blake2b(
        app_id.encode("utf-8"), digest_size=_APP_BYTES, person=b"ss-app"
    ).digest()


def _checksum(body: bytes | bytearray) -> bytes:
    return hashlib.blake2b(bytes(body), digest_size=_CHECKSUM_BYTES, person=b"ss-tok").digest()


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _partitions(partitions: list[int]) -> bytes:
    """The shorter of the two forms: ascending gaps, or a bitmap (gaps on a tie)."""
    gaps = bytearray([_GAPS])
    previous = -1
    for partition in partitions:
        gaps += _varint(partition - previous - 1)
        previous = partition
    if not partitions or partitions[-1] >> 3 >= len(gaps):
        return bytes(gaps)  # the bitmap alone would be longer
    bits = sum(1 << p for p in partitions)
    bitmap = bits.to_bytes((partitions[-1] >> 3) + 1, "little")
    form = bytes([_BITMAP]) + _varint(len(bitmap)) + bitmap
    return form if len(form) < len(gaps) else bytes(gaps)


def _offsets(offsets: list[int]) -> bytes:
    base = min(offsets, default=0)
    width = (max(offsets, default=0) - base).bit_length()
    packed = 0
    for i, offset in enumerate(offsets):
        packed |= (offset - base) << (i * width)
    return (
        _varint(base) + bytes([width]) + packed.to_bytes((len(offsets) * width + 7) // 8, "little")
    )


class _Reader:
    """Reads the body of a token whose checksum matched; ValueError or IndexError when
    the bytes do not follow the layout."""

    def __init__(self, data: bytes, at: int) -> None:
        self.data = data
        self.at = at

    def token(self) -> Token:
        topic = self.take(self.byte()).decode("utf-8")
        count = self.varint()
        if count > MAX_PARTITIONS:
            raise ValueError(f"{count} partitions")
        partitions = self.partitions(count)
        offsets = self.offsets(count)
        if self.at != len(self.data):
            raise ValueError(f"{len(self.data) - self.at} bytes left over")
        return Token(topic, dict(zip(partitions, offsets, strict=True)))

    def byte(self) -> int:
        value = self.data[self.at]
        self.at += 1
        return value

    def take(self, n: int) -> bytes:
        if self.at + n > len(self.data):
            raise ValueError("cut short")
        chunk = self.data[self.at : self.at + n]
        self.at += n
        return chunk

    def varint(self) -> int:
        value = shift = 0
        while True:
            byte = self.byte()
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                return value
            shift += 7
            if shift > 63:
                raise ValueError("varint too long")

    def partitions(self, count: int) -> list[int]:
        form = self.byte()
        if form == _GAPS:
            found, previous = [], -1
            for _ in range(count):
                previous += self.varint() + 1
                found.append(previous)
        elif form == _BITMAP:
            bits = int.from_bytes(self.take(self.varint()), "little")
            found = [p for p in range(bits.bit_length()) if bits >> p & 1]
        else:
            raise ValueError(f"partition form {form}")
        if len(found) != count or (found and found[-1] > MAX_PARTITION):
            raise ValueError("partitions do not match their count")
        return found

    def offsets(self, count: int) -> list[int]:
        base, width = self.varint(), self.byte()
        if width > 63:
            raise ValueError(f"offset width {width}")
        packed = int.from_bytes(self.take((count * width + 7) // 8), "little")
        mask = (1 << width) - 1
        offsets = [base + (packed >> (i * width) & mask) for i in range(count)]
        if any(offset > MAX_OFFSET for offset in offsets):
            raise ValueError("offset out of range")
        return offsets
