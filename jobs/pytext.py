"""The character tables with which the JVM tokenises text as this Python does.

``core.semantics.tokenize`` is ``re.split(r"\\W+", line.lower())``: Python's Unicode word
characters and its full lower-case mapping, including the final-sigma rule. Java's own
``\\w`` is ASCII by default, its Unicode data is another version, and its case mapping is
its own, so the job's Java tokeniser (``jobs/java/streamstate/jobs/PythonText.java``) reads
these tables instead, generated here from the running interpreter when the UDF jar is
built. The jar's name carries :func:`fingerprint`, so another Python builds another jar.

The format (big-endian, as ``DataInputStream`` reads it):

- ``int`` magic ``0x50595458`` and format version 1;
- three bitsets over the code points 0..0x10FFFF, each ``int`` n then n ``long``: word
  characters (``\\w``), cased and case-ignorable characters (the two properties of the
  final-sigma context, as ``str.lower`` applies them);
- ``int`` n, then n lower-case mappings: ``int`` code point, ``int`` k, k ``int``.
"""

from __future__ import annotations

import io
import re
import struct
import sys
import unicodedata

MAGIC = 0x50595458
VERSION = 1
CODE_POINTS = 0x110000
SIGMA = "\u03a3"
FINAL_SIGMA = "\u03c2"
_WORD = re.compile(r"\w")


def fingerprint() -> str:
    """What the tables depend on: the interpreter's version and its Unicode data."""
    return f"py{sys.version_info[0]}.{sys.version_info[1]}-unicode{unicodedata.unidata_version}"


def _ends_in_final_sigma(text: str) -> bool:
    # The end, not an index: lowering may lengthen the text (U+0130 gives two characters).
    return text.lower()[-1] == FINAL_SIGMA


def sigma_context(ch: str) -> tuple[bool, bool]:
    """(cased, case-ignorable) of ``ch`` as ``str.lower`` sees them around a capital sigma.

    Measured on the interpreter itself: ``ch`` before a final sigma makes it final when it
    is cased and not ignorable; between a cased letter and the sigma it keeps the sigma
    final when it is ignorable or cased. An ignorable character is skipped whether it is
    cased or not, so its cased bit is never read.
    """
    cased_alone = _ends_in_final_sigma(ch + SIGMA)
    skipped_or_cased = _ends_in_final_sigma("A" + ch + SIGMA)
    return cased_alone, skipped_or_cased and not cased_alone


def _bitset(bits: bytearray) -> bytes:
    words = len(bits) // 8
    return struct.pack(">i", words) + bytes(_big_endian_longs(bits))


def _big_endian_longs(bits: bytearray) -> bytearray:
    """``bits`` (little-endian bit order, 8 bytes per long) as big-endian longs."""
    out = bytearray(len(bits))
    for at in range(0, len(bits), 8):
        out[at : at + 8] = bits[at : at + 8][::-1]
    return out


def tables() -> bytes:
    """The tables, in the format the module docstring gives."""
    size = CODE_POINTS // 8
    word, cased, ignorable = bytearray(size), bytearray(size), bytearray(size)
    lower: list[tuple[int, str]] = []
    for cp in range(CODE_POINTS):
        if 0xD800 <= cp <= 0xDFFF:  # never in text decoded from UTF-8
            continue
        ch = chr(cp)
        bit, byte = 1 << (cp & 7), cp >> 3
        if _WORD.match(ch):
            word[byte] |= bit
        is_cased, is_ignorable = sigma_context(ch)
        if is_cased:
            cased[byte] |= bit
        if is_ignorable:
            ignorable[byte] |= bit
        mapped = ch.lower()
        if mapped != ch:
            lower.append((cp, mapped))
    out = io.BytesIO()
    out.write(struct.pack(">ii", MAGIC, VERSION))
    for bits in (word, cased, ignorable):
        out.write(_bitset(bits))
    out.write(struct.pack(">i", len(lower)))
    for cp, mapped in lower:
        out.write(struct.pack(f">ii{len(mapped)}i", cp, len(mapped), *map(ord, mapped)))
    return out.getvalue()
