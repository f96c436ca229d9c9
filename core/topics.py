"""Topic names and the configuration they are created with.

The topics records come in through (the pipelines' sources) are retained, unlimited by
default (``STREAMSTATE_SOURCE_RETENTION_MS``), because the nightly job recomputes the
tables from them; a global table's topic is compacted. Everything is keyed and valued
with raw bytes: records are validated by the pipelines, so that a bad record reaches
its dead-letter topic instead of being dropped by a decoder.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass

#: Where the nightly job's repairs go (applied by every worker: streams/corrections.py).
CORRECTIONS = "corrections"

#: The key under which each table partition keeps its position (tables/positions.py), and
#: the key of position records in repartition topics. Not valid UTF-8, so no table key
#: (raw UTF-8 or JSON) and no record key of the contract can be equal to it.
POSITION_KEY = b"\xff\xffstreamstate.position"


def partition_for(key: bytes, partitions: int) -> int:
    """The partition Kafka's default partitioner gives ``key`` (murmur2, like Java)."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


_WORDS = struct.Struct("<I")
_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 of ``data``, as an unsigned 32-bit number (the Java client's
    ``Utils.murmur2``): the same hash as aiokafka's, with the four-byte blocks unpacked
    at once, since every key read and every record a pipeline re-keys computes it."""
    length = len(data)
    h = 0x9747B28C ^ length
    whole = length & ~3
    for (k,) in _WORDS.iter_unpack(data[:whole]):
        k = (k * _M) & _MASK
        k = ((k ^ (k >> 24)) * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    rest = length & 3
    if rest:
        if rest == 3:
            h ^= data[whole + 2] << 16
        if rest >= 2:
            h ^= data[whole + 1] << 8
        h = ((h ^ data[whole]) * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    return h ^ (h >> 15)


def dlq_topic(source: str) -> str:
    """The dead-letter topic of a source topic."""
    return f"{source}-dlq"


@dataclass(frozen=True)
class TopicSpec:
    """How a topic is created."""

    name: str
    partitions: int
    config: dict[str, str]


def topic_specs(
    inputs: Iterable[str], compacted: Iterable[str], partitions: int, retention_ms: int
) -> list[TopicSpec]:
    """The topics records come in through, with their dead-letter topics, and the
    corrections topic: ``compacted`` ones (global tables' topics) compacted, the others
    retained for ``retention_ms``."""
    retained = {"retention.ms": str(retention_ms), "cleanup.policy": "delete"}
    compact = set(compacted)
    specs = []
    for name in sorted({*inputs, CORRECTIONS}):
        config = {"cleanup.policy": "compact"} if name in compact else dict(retained)
        specs.append(TopicSpec(name, partitions, config))
        specs.append(TopicSpec(dlq_topic(name), partitions, dict(retained)))
    return specs
