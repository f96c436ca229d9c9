"""A generated corpus of malformed records for the four source topics.

Every record is invalid by the contract (CONTRACT.md, "Topics and records"); each is
labelled with its kind. The corpus is deterministic for a seed.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

NOW_MS = 1_750_000_000_000
LIMIT = 64 * 1024


@dataclass(frozen=True)
class BadRecord:
    topic: str
    key: bytes | None
    value: bytes | None
    kind: str
    what: str


BASES: dict[str, dict[str, Any]] = {
    "item-events": {
        "event_id": "bad-1",
        "store_id": "store-00",
        "sku": "DAI-1",
        "kind": "sale",
        "quantity": 2,
        "unit_price": 1.25,
        "ts": NOW_MS,
    },
    "payments": {
        "payment_id": "pay-1",
        "sale_event_id": "bad-1",
        "store_id": "store-00",
        "amount": 2.5,
        "ts": NOW_MS,
    },
    "products": {"sku": "DAI-1", "name": "milk", "category": "dairy"},
}
KEY_FIELD = {"item-events": "store_id", "payments": "store_id", "products": "sku"}
STRING_FIELDS = {
    "item-events": ["event_id", "store_id", "sku"],
    "payments": ["payment_id", "sale_event_id", "store_id"],
    "products": ["sku", "name", "category"],
}
INT_FIELDS = {"item-events": ["quantity", "ts"], "payments": ["ts"], "products": []}
FLOAT_FIELDS = {"item-events": ["unit_price"], "payments": ["amount"], "products": []}
REQUIRED = {
    "item-events": ["event_id", "store_id", "sku", "kind", "quantity", "ts"],
    "payments": ["payment_id", "sale_event_id", "store_id", "amount", "ts"],
    "products": ["sku", "name", "category"],
}
WRONG_FOR_STRING: list[Any] = [123, 1.5, True, None, [], {}, ["a"], {"a": 1}]
WRONG_FOR_INT: list[Any] = ["3", 3.5, True, None, [], {}, "", "1e3"]
WRONG_FOR_FLOAT: list[Any] = ["1.0", True, None, [], {}, "NaN"]


def _keyed(topic: str, record: dict[str, Any]) -> bytes | None:
    value = record.get(KEY_FIELD[topic])
    return value.encode("utf-8", "surrogatepass") if isinstance(value, str) else b"store-00"


def _json(record: Any) -> bytes:
    return orjson.dumps(record)


class Corpus:
    """Builds the malformed records, kind by kind."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.records: list[BadRecord] = []
        self._n = 0

    def add(self, topic: str, key: bytes | None, value: bytes | None, kind: str, what: str) -> None:
        if topic == "products" and key is None:
            key = b""  # a compacted topic refuses records without a key
        self.records.append(BadRecord(topic, key, value, kind, what))

    def base(self, topic: str) -> dict[str, Any]:
        self._n += 1
        record = dict(BASES[topic])
        if topic == "item-events":
            record["event_id"] = f"bad-{self._n}"
        elif topic == "payments":
            record["payment_id"] = f"pay-{self._n}"
        return record

    def broken_json(self, topic: str, count: int) -> None:
        fixed = [b"", b"   ", b"{", b"}", b"[]", b'"text"', b"42", b"null", b"true", b"nul"]
        fixed += [b"{'sku': 'DAI-1'}", b'{"a":1,}', b'{"a" 1}', b'{"a":\x01}']
        for raw in fixed:
            self.add(topic, b"store-00", raw, "broken_json", raw[:20].decode("latin-1"))
        for _ in range(count - len(fixed)):
            record = self.base(topic)
            raw = _json(record)
            cut = self.rng.randrange(1, len(raw) - 1)
            variant = self.rng.choice(["cut", "trailing", "doubled"])
            if variant == "cut":
                raw = raw[:cut]
            elif variant == "trailing":
                raw = raw + self.rng.choice([b"}", b",", b"x", b"{}"])
            else:
                raw = raw[:cut] + raw
            self.add(topic, _keyed(topic, record), raw, "broken_json", variant)

    def wrong_types(self, topic: str) -> None:
        groups: list[tuple[list[str], list[Any]]] = [
            (STRING_FIELDS[topic], WRONG_FOR_STRING),
            (INT_FIELDS[topic], WRONG_FOR_INT),
            (FLOAT_FIELDS[topic], WRONG_FOR_FLOAT),
        ]
        if topic == "item-events":
            groups.append((["kind"], ["refund", "SALE", 1, None, ["sale"], ""]))
        for fields, wrong in groups:
            for name in fields:
                for value in wrong:
                    record = {**self.base(topic), name: value}
                    key = _keyed(topic, self.base(topic))
                    self.add(topic, key, _json(record), "wrong_type", f"{name}={value!r}")

    def missing_fields(self, topic: str) -> None:
        for name in REQUIRED[topic]:
            for _ in range(4):
                record = self.base(topic)
                key = _keyed(topic, record)
                del record[name]
                self.add(topic, key, _json(record), "missing_field", name)
        if topic == "item-events":
            record = self.base(topic)
            del record["unit_price"]
            self.add(topic, b"store-00", _json(record), "missing_field", "unit_price of a sale")
        self.add(topic, b"store-00", b"{}", "missing_field", "all")

    def huge_values(self, topic: str) -> None:
        for size in (LIMIT + 1, 70_000, 200_000, 900_000):
            record = {**self.base(topic), "padding": "x" * size}
            self.add(topic, _keyed(topic, record), _json(record), "huge", f"{size} bytes")
        for name in STRING_FIELDS[topic]:
            limit = 1024 if name == "name" else 256
            record = {**self.base(topic), name: "s" * (limit + 1 + self.rng.randrange(5000))}
            self.add(topic, _keyed(topic, record), _json(record), "huge", f"long {name}")
        numbers: list[tuple[str, Any]] = []
        if topic == "item-events":
            numbers = [("quantity", 10**7), ("quantity", 10**30), ("ts", 10**16)]
            numbers += [("unit_price", 1e10), ("ts", -1), ("quantity", -(10**7))]
        elif topic == "payments":
            numbers = [("amount", 1e13), ("ts", 10**16), ("ts", -5), ("amount", -1.0)]
        for name, value in numbers:
            raw = _json({**self.base(topic), name: 0}).replace(
                f'"{name}":0'.encode(), f'"{name}":{value}'.encode()
            )
            self.add(topic, _keyed(topic, self.base(topic)), raw, "huge", f"{name}={value}")
        for literal in (b"1e400", b"NaN", b"Infinity", b"-Infinity"):
            field = FLOAT_FIELDS[topic][0] if FLOAT_FIELDS[topic] else "name"
            raw = _json({**self.base(topic), field: 0}).replace(
                f'"{field}":0'.encode(), f'"{field}":'.encode() + literal
            )
            self.add(topic, b"store-00", raw, "huge", f"{field}={literal.decode()}")
        deep = b"[" * 5000 + b"]" * 5000
        raw = _json({**self.base(topic), "sku": 0}).replace(b'"sku":0', b'"sku":' + deep)
        self.add(topic, b"store-00", raw, "huge", "nesting 5000 deep")

    def garbage(self, topic: str, count: int) -> None:
        for n in range(count):
            length = self.rng.randrange(1, 512)
            body = bytes(self.rng.randrange(256) for _ in range(length))
            raw = (b"\xff" if n % 2 else b'{"\xfe') + body
            self.add(topic, self.rng.choice([None, b"store-00", body[:8]]), raw, "garbage", "")

    def encodings(self, topic: str, make: Callable[[], str]) -> None:
        for codec in ("utf-16", "utf-16-le", "utf-16-be", "utf-32", "latin-1", "cp1252"):
            for _ in range(3):
                text = make()
                self.add(topic, b"store-00", text.encode(codec, "replace"), "encoding", codec)
        for raw in (b"\xc0\xaf", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80", b"\xc3\x28"):
            self.add(topic, b"store-00", b'{"sku": "' + raw + b'"}', "encoding", repr(raw))

    def surrogates(self, topic: str) -> None:
        """Valid JSON and UTF-8 whose strings hold lone UTF-16 surrogates."""
        for name in STRING_FIELDS[topic]:
            for escape in ("\\ud800", "\\udfff", "a\\ud83d"):
                raw = _json({**self.base(topic), name: "@"}).replace(
                    f'"{name}":"@"'.encode(), f'"{name}":"{escape}"'.encode()
                )
                key = b"store-00" if name != KEY_FIELD[topic] else b"\xed\xa0\x80"
                self.add(topic, key, raw, "encoding", f"lone surrogate in {name}")

    def key_mismatch(self, topic: str) -> None:
        record = self.base(topic)
        true_key = str(record[KEY_FIELD[topic]])
        keys = [None, b"", b"other", true_key.swapcase().encode(), (true_key + " ").encode()]
        keys += [b'"' + true_key.encode() + b'"', true_key.encode("utf-16")]
        for key in keys:
            for _ in range(3):
                self.add(topic, key, _json(self.base(topic)), "key_mismatch", repr(key))

    def semantic(self, topic: str) -> None:
        cases: list[dict[str, Any]] = []
        if topic == "item-events":
            cases = [
                {"kind": "sale", "quantity": 0},
                {"kind": "sale", "quantity": -3},
                {"kind": "restock", "quantity": 0},
                {"kind": "restock", "quantity": -1},
                {"kind": "adjust", "quantity": 0},
                {"kind": "sale", "unit_price": -1.0},
                {"kind": "sale", "unit_price": None},
                {"event_id": ""},
                {"sku": ""},
            ]
        elif topic == "payments":
            cases = [{"amount": -0.01}, {"payment_id": ""}, {"sale_event_id": ""}]
        elif topic == "products":
            cases = [{"category": ""}, {"sku": ""}]
        for change in cases:
            for _ in range(3):
                record = {**self.base(topic), **change}
                key = b"store-00" if topic != "products" else b"DAI-1"
                self.add(topic, key, _json(record), "semantic", repr(change))

    def nulls(self, topic: str) -> None:
        for _ in range(5):
            self.add(topic, b"store-00", None, "null_value", "tombstone on a non-compacted topic")


def _accented(record: dict[str, Any], topic: str) -> str:
    """A record whose first string field holds non-ASCII text (so latin-1 differs)."""
    field = STRING_FIELDS[topic][0]
    return orjson.dumps({**record, field: f"{record[field]}-café"}).decode()


def _accented_maker(corpus: Corpus, topic: str) -> Callable[[], str]:
    return lambda: _accented(corpus.base(topic), topic)


def _line(rng: random.Random) -> str:
    return " ".join(rng.choice(["café", "straße", "ΣΟΦΙΑ", "élan", "naïve"]) for _ in range(5))


def build(seed: int = 13, scale: int = 1) -> list[BadRecord]:
    """The corpus: about 1,100 records per ``scale``, every kind on every topic."""
    corpus = Corpus(seed)
    for _ in range(scale):
        for topic in ("item-events", "payments", "products"):
            corpus.broken_json(topic, 120)
            corpus.wrong_types(topic)
            corpus.missing_fields(topic)
            corpus.huge_values(topic)
            corpus.garbage(topic, 50)
            corpus.encodings(topic, _accented_maker(corpus, topic))
            corpus.surrogates(topic)
            corpus.key_mismatch(topic)
            corpus.semantic(topic)
            if topic != "products":  # a null value on products is a valid tombstone
                corpus.nulls(topic)
        corpus.garbage("text-lines", 100)
        corpus.encodings("text-lines", lambda: _line(corpus.rng))
        corpus.nulls("text-lines")
        for size in (LIMIT + 1, 100_000, 500_000):
            corpus.add("text-lines", None, b"word " * (size // 5 + 1), "huge", f"{size} bytes")
    return corpus.records
