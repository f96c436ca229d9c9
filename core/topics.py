"""Topic names and the configuration they are created with.

The source topics are retained (unlimited by default, ``STREAMSTATE_SOURCE_RETENTION_MS``)
because the nightly job recomputes the tables from them; ``products`` is compacted.
Everything is keyed and valued with raw bytes: records are validated by the agents, so
that a bad record reaches its dead-letter topic instead of being dropped by a decoder.
"""

from __future__ import annotations

from dataclasses import dataclass

from aiokafka.partitioner import murmur2

TEXT_LINES = "text-lines"
ITEM_EVENTS = "item-events"
PRODUCTS = "products"
PAYMENTS = "payments"
SETTLED_SALES = "settled-sales"
CORRECTIONS = "corrections"

SOURCE_TOPICS = (TEXT_LINES, ITEM_EVENTS, PRODUCTS, PAYMENTS)


#: The key under which each table partition keeps its position (tables/positions.py), and
#: the key of position records in repartition topics. Not valid UTF-8, so no table key
#: (raw UTF-8 or JSON) and no record key of the contract can be equal to it.
POSITION_KEY = b"\xff\xffstreamstate.position"


def partition_for(key: bytes, partitions: int) -> int:
    """The partition Kafka's default partitioner gives ``key`` (murmur2, like Java)."""
    hashed: int = murmur2(key)
    return (hashed & 0x7FFFFFFF) % partitions


def dlq_topic(source: str) -> str:
    """The dead-letter topic of a source topic."""
    return f"{source}-dlq"


@dataclass(frozen=True)
class TopicSpec:
    """How a topic is created."""

    name: str
    partitions: int
    config: dict[str, str]


def topic_specs(partitions: int, retention_ms: int) -> list[TopicSpec]:
    """Every topic the pipelines read or write, besides faust's own internal topics."""
    retained = {"retention.ms": str(retention_ms), "cleanup.policy": "delete"}
    compacted = {"cleanup.policy": "compact"}
    specs = [TopicSpec(name, partitions, dict(retained)) for name in SOURCE_TOPICS]
    specs[SOURCE_TOPICS.index(PRODUCTS)] = TopicSpec(PRODUCTS, partitions, compacted)
    specs += [TopicSpec(dlq_topic(name), partitions, dict(retained)) for name in SOURCE_TOPICS]
    specs += [
        TopicSpec(SETTLED_SALES, partitions, dict(retained)),
        TopicSpec(CORRECTIONS, partitions, dict(retained)),
        TopicSpec(dlq_topic(CORRECTIONS), partitions, dict(retained)),
    ]
    return specs
