"""The bulk restore's planning and its write of one fetched run (real RocksDB files)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from faust.types import TP

from tables.faust_adapter import (
    EngineTable,
    FaustTableStore,
    TrackedRecovery,
    newer_than_stored,
    persisted_offset,
    tracked_only,
    write_run,
)
from tables.restore import bulk_plan

A = TP("streamstate-word_counts-changelog", 0)
B = TP("streamstate-word_counts-changelog", 1)
C = TP("streamstate-inventory-changelog", 0)


def test_only_partitions_far_enough_behind_are_read_in_bulk() -> None:
    starts = {A: -1, B: 9_000, C: None}
    highwaters = {A: 9_999, B: 9_999, C: -1}
    # A: nothing applied, offsets 0..9999; B: 999 records behind; C: empty partition.
    assert bulk_plan(starts, highwaters, 1_000) == {A: (0, 10_000)}
    assert bulk_plan(starts, highwaters, 999) == {A: (0, 10_000), B: (9_001, 10_000)}
    assert bulk_plan({A: 9_999}, {A: 9_999}, 1) == {}
    assert bulk_plan({}, {A: None}, 1) == {}


def _recovery(generation: int, ready: tuple[int, frozenset[TP], int | None] | None) -> Any:
    recovery = TrackedRecovery.__new__(TrackedRecovery)  # its decision only: no service
    recovery._generation_id = generation
    recovery._ready = ready
    recovery.stores_epoch = lambda: 7
    return recovery


def test_partitions_kept_from_the_generation_before_need_no_read_of_their_markers() -> None:
    actives = frozenset({A, C})
    assert _recovery(5, (4, actives, 7)).kept_partitions() == actives
    assert _recovery(5, None).kept_partitions() == frozenset()  # never ready
    # Out of the group for a generation: another worker may have written them.
    assert _recovery(6, (4, actives, 7)).kept_partitions() == frozenset()
    # A transaction failed or a store failed since: a store may be behind.
    assert _recovery(5, (4, actives, 6)).kept_partitions() == frozenset()
    # at_least_once: no transaction markers, and nothing assumed.
    assert _recovery(5, (4, actives, None)).kept_partitions() == frozenset()
    unwired = _recovery(5, (4, actives, 7))
    unwired.stores_epoch = None
    assert unwired.kept_partitions() == frozenset()


@dataclass
class Record:
    offset: int
    key: bytes | None
    value: bytes | None


def word_counts(monkeypatch: pytest.MonkeyPatch, datadir: Path) -> EngineTable:
    """The app's word_counts table: a real faust table on RocksDB files in ``datadir``."""
    from app.main import create_app
    from core.settings import Settings

    monkeypatch.setenv("APP_DATADIR", str(datadir))
    table = create_app(Settings()).tables["word_counts"]
    assert isinstance(table, EngineTable)
    return table


def test_a_run_is_written_with_its_offset_and_tombstones_delete(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = word_counts(monkeypatch, tmp_path)
    db = FaustTableStore(table).partition(3).db
    db[b"gone"] = b"1"
    run = [
        Record(10, "état".encode(), b"1"),
        Record(11, "straße".encode(), b"2"),
        Record(12, "état".encode(), b"5"),
        Record(13, b"gone", None),
        Record(14, None, b"ignored"),
    ]
    assert write_run(table.data, 3, run, 14) == 4
    assert db["état".encode()] == b"5"
    assert db["straße".encode()] == b"2"
    assert db.get(b"gone") is None
    assert persisted_offset(table, TP(table.changelog_topic.get_topic_name(), 3)) == 14
    # Only markers past the last record: the offset moves on, no record is written.
    assert write_run(table.data, 3, [], 16) == 0
    assert persisted_offset(table, TP(table.changelog_topic.get_topic_name(), 3)) == 16


@dataclass
class Message:
    tp: TP


@dataclass
class Event:
    message: Message


@dataclass
class Tracking:
    active_tps: set[TP]
    standby_tps: set[TP]
    untracked_records: int = 0
    stale_records: int = 0


def test_recovery_gets_only_records_of_partitions_it_restores_now() -> None:
    recovery = Tracking(active_tps={A}, standby_tps={C})
    queue: asyncio.Queue[Event] = asyncio.Queue()
    tracked_only(queue, recovery)
    for tp in (B, A, B, C):  # B: a partition a rebalance took away
        queue.put_nowait(Event(Message(tp)))

    async def drain() -> list[TP]:
        return [(await queue.get()).message.tp for _ in range(2)]

    assert asyncio.run(drain()) == [A, C]
    assert recovery.untracked_records == 2
    recovery.standby_tps.add(B)  # assigned again: its records count again
    queue.put_nowait(Event(Message(B)))
    assert asyncio.run(queue.get()).message.tp == B


@dataclass
class Fetched:
    tp: TP
    offset: int
    fetched_at: tuple[str, int]


def test_recovery_gets_no_record_fetched_before_its_partition_was_sought_again() -> None:
    """A record fetched before a seek (or a new assignment) of its partition is left
    out; the one fetched after it, from where the recovery sought, is handed on."""
    recovery = Tracking(active_tps={A}, standby_tps={C})
    marks = {A: ("state-1", 1), C: ("state-1", 1)}
    queue: asyncio.Queue[Event] = asyncio.Queue()
    tracked_only(queue, recovery, marks.__getitem__)
    for offset in (10, 11):  # queued before the seek
        queue.put_nowait(Event(Fetched(A, offset, ("state-1", 1))))  # type: ignore[arg-type]
    queue.put_nowait(Event(Fetched(C, 7, ("state-1", 1))))  # type: ignore[arg-type]
    marks[A] = ("state-1", 2)  # the recovery seeks A back to offset 5
    queue.put_nowait(Event(Fetched(A, 5, ("state-1", 2))))  # type: ignore[arg-type]

    async def drain() -> list[tuple[TP, int]]:
        taken = [(await queue.get()).message for _ in range(2)]
        return [(m.tp, m.offset) for m in taken]  # type: ignore[attr-defined]

    assert asyncio.run(drain()) == [(C, 7), (A, 5)]
    assert recovery.stale_records == 2
    marks[C] = ("state-2", 0)  # C assigned anew: what was fetched before is stale
    queue.put_nowait(Event(Fetched(C, 8, ("state-1", 1))))  # type: ignore[arg-type]
    queue.put_nowait(Event(Fetched(C, 8, ("state-2", 0))))  # type: ignore[arg-type]
    assert asyncio.run(queue.get()).message.fetched_at == ("state-2", 0)  # type: ignore[attr-defined]
    assert recovery.stale_records == 3


@dataclass
class ChangelogMessage:
    tp: TP
    offset: int
    key: bytes
    value: bytes | None

    @property
    def partition(self) -> int:
        return self.tp.partition


def _changelog(tp: TP, offsets: range, value: bytes) -> list[Event]:
    return [
        Event(ChangelogMessage(tp, o, f"k{o % 4}".encode(), value))  # type: ignore[arg-type]
        for o in offsets
    ]


def test_records_a_partition_already_holds_are_not_written_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A buffer flushed after the bulk restore (or the engine) wrote past it leaves the
    newer values and the offset alone, and writes only what lies beyond them."""
    table = word_counts(monkeypatch, tmp_path)
    tp = TP(table.changelog_topic.get_topic_name(), 2)
    db = FaustTableStore(table).partition(2).db
    # what the bulk restore wrote: offsets 0..20, the last values "new"
    write_run(table.data, 2, [Record(o, f"k{o % 4}".encode(), b"new") for o in range(21)], 20)
    # a stale buffer of offsets 10..24, then a second flush of 25..26
    table.apply_changelog_batch(_changelog(tp, range(10, 25), b"buffered"))
    assert {db[f"k{n}".encode()] for n in (1, 2, 3, 0)} == {b"buffered"}  # 21..24 written
    assert persisted_offset(table, tp) == 24
    db[b"k1"] = b"engine"  # the engine writes a cycle at changelog offset 30
    table.data.set_persisted_offset(tp, 30)
    table.apply_changelog_batch(_changelog(tp, range(25, 27), b"late"))
    assert db[b"k1"] == b"engine"
    assert persisted_offset(table, tp) == 30
    assert newer_than_stored(table.data, _changelog(tp, range(29, 33), b"x")) == _changelog(
        tp, range(31, 33), b"x"
    )


def test_table_partitions_open_with_the_configured_memtable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STREAMSTATE_ROCKSDB_WRITE_BUFFER_MB", "2")
    table = word_counts(monkeypatch, tmp_path)
    assert table.data.rocksdb_options.write_buffer_size == 2 * 1024 * 1024
    FaustTableStore(table).partition(0)
    options = next((tmp_path / "v1" / "tables").glob("word_counts-0.db/OPTIONS-*")).read_text()
    assert "write_buffer_size=2097152" in options
