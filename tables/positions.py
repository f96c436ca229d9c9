"""Positions: which offsets of which topics a table partition's state holds.

Every batch cycle writes, into each table partition it feeds and into that partition's
changelog, the :class:`Position` of the task that writes it, under :data:`POSITION_KEY`:

* ``applied``: per topic and partition, the first offset whose effect the partition does
  not hold yet. It names the table's direct inputs (the topics its pipelines read) and,
  for a table fed through a repartition topic, the *source* topics upstream of it:
  partition 3 of a table counted through a repartition topic holds each partition of
  its source topic up to some offset.
* ``upstream``: per repartition topic the table reads, the source offsets its records
  carried, so that a task that starts again knows them before the next record arrives.

Source offsets cross a repartition topic as Kafka Streams carries its ``Position`` in
record headers, here in records of their own: each cycle of a pipeline that sends to a
repartition topic ends with one position record per partition of that topic (key
:data:`POSITION_KEY`, value the sender's source offsets), after its data records and in
the same transaction. The reading task applies the records before it, then takes the
offsets; position records never reach a batch function.

A standby holds the position its changelog brought, so it says how far its copy goes in
terms of the source topics too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

import orjson

from tables.pipeline import Pipeline

#: topic -> partition -> the first offset not applied
Offsets = dict[str, dict[int, int]]


def merge_into(target: Offsets, more: Mapping[str, Mapping[int, int]]) -> None:
    """Raise ``target``'s offsets to ``more``'s where they are larger (positions only grow)."""
    for topic, partitions in more.items():
        mine = target.setdefault(topic, {})
        for partition, offset in partitions.items():
            if offset > mine.get(partition, -1):
                mine[partition] = offset


def encode_offsets(offsets: Mapping[str, Mapping[int, int]]) -> bytes:
    return orjson.dumps(_as_json(offsets))


def decode_offsets(raw: bytes) -> Offsets:
    return _from_json(orjson.loads(raw))


def _as_json(offsets: Mapping[str, Mapping[int, int]]) -> dict[str, dict[str, int]]:
    return {t: {str(p): o for p, o in sorted(ps.items())} for t, ps in sorted(offsets.items())}


def _from_json(data: object) -> Offsets:
    if not isinstance(data, dict):
        raise ValueError(f"offsets are a JSON object, not {type(data).__name__}")
    return {str(t): {int(p): int(o) for p, o in ps.items()} for t, ps in data.items()}


@dataclass
class Position:
    """What one table partition holds: see the module's docstring."""

    applied: Offsets = field(default_factory=dict)
    upstream: dict[str, Offsets] = field(default_factory=dict)

    def encode(self) -> bytes:
        upstream = {t: _as_json(o) for t, o in sorted(self.upstream.items())}
        return orjson.dumps({"applied": _as_json(self.applied), "upstream": upstream})

    @classmethod
    def decode(cls, raw: bytes) -> Position:
        data = orjson.loads(raw)
        upstream = {str(t): _from_json(o) for t, o in data.get("upstream", {}).items()}
        return cls(_from_json(data["applied"]), upstream)


Reach = Literal["direct", "upstream"]


@dataclass(frozen=True)
class Lineage:
    """Which topics feed which tables, from the pipelines' declarations.

    ``internal``: the repartition topics, which pipelines both send to and read.
    ``feeds``: per table, the topics the pipelines that write it read.
    ``senders``: per repartition topic, the topics the pipelines that send to it read.
    """

    internal: frozenset[str]
    feeds: Mapping[str, frozenset[str]]
    senders: Mapping[str, frozenset[str]]

    @classmethod
    def of(cls, pipelines: Iterable[Pipeline]) -> Lineage:
        reads: set[str] = set()
        produces: set[str] = set()
        feeds: dict[str, set[str]] = {}
        senders: dict[str, set[str]] = {}
        for pipeline in pipelines:
            reads.update(pipeline.reads)
            produces.update(pipeline.produces)
            for spec in pipeline.writes:
                feeds.setdefault(spec.name, set()).update(pipeline.reads)
            for topic in pipeline.produces:
                senders.setdefault(topic, set()).update(pipeline.reads)
        internal = frozenset(reads & produces)
        return cls(
            internal,
            {t: frozenset(s) for t, s in feeds.items()},
            {t: frozenset(s) for t, s in senders.items() if t in internal},
        )

    def sources(self, table: str) -> dict[str, Reach]:
        """The topics outside the pipelines whose records reach ``table``: ``direct``
        when a pipeline writing it reads them (partition p feeds partition p),
        ``upstream`` when they arrive through a repartition topic (every partition
        feeds every partition)."""
        found: dict[str, Reach] = {}
        for topic in self.feeds.get(table, ()):
            if topic not in self.internal:
                found[topic] = "direct"
            else:
                for source in self._upstream_of(topic, frozenset()):
                    found.setdefault(source, "upstream")
        return found

    def _upstream_of(self, topic: str, seen: frozenset[str]) -> set[str]:
        found: set[str] = set()
        for read in self.senders.get(topic, ()):
            if read not in self.internal:
                found.add(read)
            elif read not in seen:
                found |= self._upstream_of(read, seen | {topic})
        return found
