"""The replay the audit of the copies on disk compares them with (chaos/replicas.py)."""

from __future__ import annotations

from chaos.replicas import replay
from tests.support.kafka_io import Record


def _record(partition: int, offset: int, key: bytes | None, value: bytes | None) -> Record:
    return Record(key, value, partition, offset, 0, {})


def test_each_partition_is_replayed_on_its_own_to_its_last_offset() -> None:
    records = [
        _record(0, 0, b"a", b"1"),
        _record(1, 0, b"a", b"x"),  # the same key in another partition
        _record(0, 1, b"b", b"2"),
        _record(0, 3, b"a", None),  # a tombstone (offset 2: a transaction marker)
        _record(1, 5, None, b"no key"),  # skipped, but its offset counts
        _record(0, 4, b"b", b"3"),
    ]
    assert replay(records) == {0: (4, {b"b": b"3"}), 1: (5, {b"a": b"x"})}
    assert replay([]) == {}
