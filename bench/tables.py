"""The tables a run left behind, and the check that two implementations computed the
same ones: the project's (read back from its changelog topics) against Kafka Streams'
(dumped by its JVM), key by key."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from bench.kafka import read_topic
from tables.windows import parse_window_key

#: The project's tables by name, with how each changelog key becomes a comparable key.
PROJECT_APP = "streamstate"
WINDOWED = "sales_by_category"


def changelog_topic(table: str, app: str = PROJECT_APP) -> str:
    return f"{app}-{table}-changelog"


def table_key(table: str, raw: bytes) -> str | None:
    """The comparable key of a changelog key, or None for a record that is no table key
    (the engine's position record, which is not UTF-8).

    Windows become ``<category>@<window start ms>``, as in the corrections topic.
    """
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if table != WINDOWED:
        return text
    parsed = parse_window_key(raw)
    return None if parsed is None else f"{parsed[0]}@{parsed[1]}"


def changelog_table(
    table: str, records: Iterable[tuple[bytes | None, bytes | None]]
) -> dict[str, Any]:
    """A table from its changelog records in order: the last value of each key, a
    tombstone deleting it."""
    out: dict[str, Any] = {}
    for raw_key, raw_value in records:
        key = None if raw_key is None else table_key(table, raw_key)
        if key is None:
            continue
        if raw_value is None:
            out.pop(key, None)
        else:
            out[key] = orjson.loads(raw_value)
    return out


async def project_tables(bootstrap: str, names: Iterable[str]) -> dict[str, dict[str, Any]]:
    """The project's tables, read ``read_committed`` from their changelog topics."""
    return {
        name: changelog_table(name, await read_topic(bootstrap, changelog_topic(name)))
        for name in names
    }


def pair_id(value: bytes | None) -> str:
    """``<sale event_id>/<payment_id>`` of a settled-sales record."""
    pair = orjson.loads(value or b"{}")
    return f"{pair['sale']['event_id']}/{pair['payment']['payment_id']}"


async def settled_pairs(bootstrap: str, topic: str) -> Counter[str]:
    """How often each (sale, payment) pair was written to a settled-sales topic."""
    return Counter(pair_id(value) for _key, value in await read_topic(bootstrap, topic))


def same(a: Any, b: Any, rel: float = 1e-9, abs_: float = 1e-6) -> bool:
    """Equal JSON values, numbers within a relative tolerance (sums of floats in another
    order differ in the last bits)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k], rel, abs_) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y, rel, abs_) for x, y in zip(a, b, strict=True))
    if type(a) in (int, float) and type(b) in (int, float):  # not bool, a subclass of int
        return math.isclose(a, b, rel_tol=rel, abs_tol=abs_)
    return bool(a == b)


@dataclass
class Difference:
    """How one table of two implementations differs."""

    keys: int = 0
    only_first: int = 0
    only_second: int = 0
    different: int = 0
    #: a few of the differing keys: (key, first value, second value)
    examples: list[tuple[str, Any, Any]] = field(default_factory=list)

    @property
    def equal(self) -> bool:
        return not (self.only_first or self.only_second or self.different)

    def describe(self, first: str, second: str) -> str:
        if self.equal:
            return f"{self.keys:,} keys, equal"
        shown = "; ".join(f"{k!r}: {a!r} vs {b!r}" for k, a, b in self.examples)
        return (
            f"{self.keys:,} keys: {self.different:,} with other values, {self.only_first:,} "
            f"only in {first}, {self.only_second:,} only in {second} (e.g. {shown})"
        )


def compare_table(
    first: Mapping[str, Any],
    second: Mapping[str, Any],
    equal: Callable[[Any, Any], bool] = same,
    examples: int = 3,
) -> Difference:
    diff = Difference(keys=len(first.keys() | second.keys()))
    for key in sorted(first.keys() | second.keys()):
        a, b = first.get(key), second.get(key)
        if key not in second:
            diff.only_first += 1
        elif key not in first:
            diff.only_second += 1
        elif equal(a, b):
            continue
        else:
            diff.different += 1
        if len(diff.examples) < examples:
            diff.examples.append((key, a, b))
    return diff


def compare(
    first: Mapping[str, Mapping[str, Any]], second: Mapping[str, Mapping[str, Any]]
) -> dict[str, Difference]:
    """Every table of either side, compared key by key (a missing table is empty)."""
    return {
        name: compare_table(first.get(name, {}), second.get(name, {}))
        for name in sorted(first.keys() | second.keys())
    }
