"""What each topic takes (tables/limits.py): record sizes as Kafka counts them, the rules
read from a topic's configuration, and the timestamps the engine gives its records."""

from __future__ import annotations

import pytest
from aiokafka.record.default_records import DefaultRecordBatchBuilder

from tables.limits import (
    CLOCK_MARGIN_MS,
    UNLIMITED,
    TopicLimits,
    record_batch_bytes,
    record_bytes_bound,
    refusal,
    stamp,
    topic_limits,
)

NOW = 1_764_000_000_000
RECORDS = [
    (None, None, []),
    (b"", b"", []),
    (b"k", b"v" * 63, []),
    (b"k", b"v" * 64, []),
    (b"k" * 200, b"v" * 20_000, [("error", b"x" * 300), ("source-offset", b"12")]),
    (None, b"v" * 1_000_000, []),
]


def built(records: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]]) -> int:
    """The size of the record batch aiokafka's producer builds of ``records``."""
    builder = DefaultRecordBatchBuilder(2, 0, 0, -1, -1, -1, 1 << 30)
    for offset, (key, value, headers) in enumerate(records):
        builder.append(offset, NOW + offset * 7_919, key, value, headers)
    return len(builder.build())


@pytest.mark.parametrize("record", RECORDS, ids=range(len(RECORDS)))
def test_a_lone_records_batch_size_is_what_the_producer_builds(
    record: tuple[bytes | None, bytes | None, list[tuple[str, bytes]]],
) -> None:
    assert record_batch_bytes(*record) == built([record])


def test_the_bound_per_record_covers_what_each_record_adds_to_a_batch() -> None:
    records = RECORDS * 3
    bounded = built(records[:1]) + sum(record_bytes_bound(*r) for r in records[1:])
    assert bounded >= built(records)


def test_a_record_is_refused_one_byte_past_the_topics_max_message_bytes() -> None:
    key, value = b"store-1", b"v" * 5_000
    size = record_batch_bytes(key, value)
    limits = TopicLimits(max_message_bytes=size)
    assert refusal("t", key, value, None, None, limits, NOW, size) is None
    why = refusal("t", key, value, None, None, limits, NOW, size - 1)
    assert why is not None
    assert why.startswith("MessageSizeTooLargeError")


def test_a_compacted_topic_refuses_a_record_without_a_key() -> None:
    assert refusal("c", None, b"v", None, None, TopicLimits(compacted=True), NOW, 1000)
    assert refusal("c", b"k", b"v", None, None, TopicLimits(compacted=True), NOW, 1000) is None
    assert refusal("d", None, b"v", None, None, TopicLimits(), NOW, 1000) is None


def test_a_timestamp_past_the_topics_bounds_is_refused() -> None:
    limits = TopicLimits(after_max_ms=3_600_000, before_max_ms=86_400_000)
    assert limits.time_refusal(NOW + 3_600_000, NOW) is None
    assert "after.max" in (limits.time_refusal(NOW + 3_600_001, NOW) or "")
    assert "before.max" in (limits.time_refusal(NOW - 86_400_001, NOW) or "")
    assert TopicLimits(log_append_time=True).time_refusal(NOW + 10**12, NOW) is None


def test_the_engine_stamps_the_inputs_time_unless_the_topic_would_refuse_it() -> None:
    limits = TopicLimits(after_max_ms=3_600_000)
    assert stamp(NOW - 10**11, limits, NOW) == NOW - 10**11  # years behind: taken
    assert stamp(NOW + 3_600_000 - CLOCK_MARGIN_MS, limits, NOW) == NOW + 3_540_000
    assert stamp(NOW + 3_600_000 - CLOCK_MARGIN_MS + 1, limits, NOW) == NOW
    assert stamp(NOW + 2 * 3_600_000, limits, NOW) == NOW
    assert stamp(-1, limits, NOW) == NOW
    bounded = TopicLimits(before_max_ms=86_400_000)
    assert stamp(NOW - 2 * 86_400_000, bounded, NOW) == NOW


def test_a_topics_rules_come_from_its_configuration_and_else_the_brokers() -> None:
    described = {
        "cleanup.policy": "compact,delete",
        "max.message.bytes": "2000",
        "message.timestamp.type": "LogAppendTime",
        "message.timestamp.after.max.ms": str(UNLIMITED),
        "message.timestamp.before.max.ms": "86400000",
    }
    assert topic_limits(described, {}) == TopicLimits(
        max_message_bytes=2000,
        compacted=True,
        log_append_time=True,
        after_max_ms=None,
        before_max_ms=86_400_000,
    )
    broker = {"message.max.bytes": "5000", "log.message.timestamp.after.max.ms": "60000"}
    assert topic_limits({}, broker) == TopicLimits(max_message_bytes=5000, after_max_ms=60_000)
    assert topic_limits({}, {}) == TopicLimits()
