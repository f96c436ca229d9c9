"""The bulk restore's planning and its write of one fetched run (real RocksDB files)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

from faust.types import TP
from rocksdict import Options, Rdict

from tables.faust_adapter import tracked_only, write_run
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


@dataclass
class Record:
    offset: int
    key: bytes | None
    value: bytes | None


class Store:
    """The two parts of faust's RocksDB store that a bulk write uses."""

    offset_key = b"__faust\0offset__"

    def __init__(self, path: Path) -> None:
        self.dbs: dict[int, Rdict] = {}
        self.path = path

    def _db_for_partition(self, partition: int) -> Rdict:
        if partition not in self.dbs:
            self.dbs[partition] = Rdict(
                str(self.path / str(partition)), options=Options(raw_mode=True)
            )
        return self.dbs[partition]


def test_a_run_is_written_with_its_offset_and_tombstones_delete(tmp_path: Path) -> None:
    store = Store(tmp_path)
    db = store._db_for_partition(3)
    db[b"gone"] = b"1"
    run = [
        Record(10, "état".encode(), b"1"),
        Record(11, "straße".encode(), b"2"),
        Record(12, "état".encode(), b"5"),
        Record(13, b"gone", None),
        Record(14, None, b"ignored"),
    ]
    assert write_run(store, 3, run, 14) == 4
    assert db["état".encode()] == b"5"
    assert db["straße".encode()] == b"2"
    assert db.get(b"gone") is None
    assert db[Store.offset_key] == b"14"
    # Only markers past the last record: the offset moves on, no record is written.
    assert write_run(store, 3, [], 16) == 0
    assert db[Store.offset_key] == b"16"
    for opened in store.dbs.values():
        opened.close()


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
