"""Changelog records wait in the fetch loop's backlog until faust's recovery can take
them, in their order, so that the sources are never held back."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from rocksdict import Options, Rdict

from tables import faust_adapter
from tables.engine import TP
from tables.faust_adapter import ChangelogBacklog
from tables.restore import RestoreStats


class Queue:
    def __init__(self, room: int) -> None:
        self.room = room
        self.items: list[Any] = []

    def full(self) -> bool:
        return len(self.items) >= self.room


class Flow:
    def __init__(self) -> None:
        self.active = True

    def is_active(self) -> bool:
        return self.active


def app_with(
    queue: Queue, flow: Flow, delay: float = 0.0, recovery: Any = None, seeks: Any = None
) -> Any:
    async def callback(message: Any) -> None:
        if delay:
            await asyncio.sleep(delay)
        queue.items.append(message)

    consumer = SimpleNamespace(
        callback=callback,
        _to_message=lambda tp, record: SimpleNamespace(tp=tp, record=record),
        # what fetch_mark reads: no aiokafka consumer (state None), and the seeks made
        _thread=SimpleNamespace(_consumer=None, seeks=Counter(seeks or {})),
    )
    if recovery is None:
        recovery = SimpleNamespace(standby_tps=set(), active_tps=set())
    tables = SimpleNamespace(changelog_queue=queue, recovery=recovery)
    return SimpleNamespace(consumer=consumer, tables=tables, flow_control=flow)


async def test_records_go_on_in_order_while_the_queue_has_room() -> None:
    queue, flow = Queue(room=3), Flow()
    backlog = ChangelogBacklog(app_with(queue, flow))
    backlog.add("c-0", [1, 2], ("gen-a", 1))
    backlog.add("c-1", [3, 4], ("gen-b", 2))
    await backlog.feed()
    assert [(m.tp, m.record, m.fetched_at) for m in queue.items] == [
        ("c-0", 1, ("gen-a", 1)),
        ("c-0", 2, ("gen-a", 1)),
        ("c-1", 3, ("gen-b", 2)),
    ]
    assert backlog  # one record waits for room
    queue.items.clear()
    await backlog.feed()
    assert [m.record for m in queue.items] == [4]
    assert not backlog


async def test_nothing_goes_on_while_faust_holds_its_flow() -> None:
    queue, flow = Queue(room=10), Flow()
    backlog = ChangelogBacklog(app_with(queue, flow))
    backlog.add("c-0", [1, 2], None)
    flow.active = False  # a rebalance: faust's put would wait for the flow
    await backlog.feed()
    assert queue.items == []
    assert backlog
    flow.active = True
    await backlog.feed()
    assert [m.record for m in queue.items] == [1, 2]


async def test_a_round_hands_on_for_one_slice_at_most(monkeypatch: Any) -> None:
    monkeypatch.setattr(faust_adapter, "BACKLOG_SLICE_S", 0.05)
    queue, flow = Queue(room=10_000), Flow()
    backlog = ChangelogBacklog(app_with(queue, flow, delay=0.02))
    backlog.add("c-0", list(range(100)), None)
    await backlog.feed()
    assert 1 <= len(queue.items) < 100  # the rest waits for the next round
    assert [m.record for m in queue.items] == list(range(len(queue.items)))


class Store:
    """A faust RocksDB store's surface the standby path writes through, over real
    RocksDB databases (one per partition)."""

    offset_key = b"__faust\0offset__"
    use_rocksdict = True

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.dbs: dict[int, Rdict] = {}

    def _db_for_partition(self, partition: int) -> Rdict:
        if partition not in self.dbs:
            self.dbs[partition] = Rdict(str(self.folder / str(partition)), Options(raw_mode=True))
        return self.dbs[partition]

    def persisted_offset(self, tp: Any) -> int | None:
        found = self._db_for_partition(tp.partition).get(self.offset_key)
        return None if found is None else int(found)

    def close(self) -> None:
        for db in self.dbs.values():
            db.close()


def record(offset: int, key: bytes, value: bytes | None) -> Any:
    return SimpleNamespace(offset=offset, key=key, value=value)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    found = Store(tmp_path)
    yield found
    found.close()


STANDBY = TP("app-t-changelog", 1)
ACTIVE = TP("app-t-changelog", 2)


def standby_recovery(store: Store) -> Any:
    table = SimpleNamespace(data=store)
    return SimpleNamespace(
        standby_tps={STANDBY},
        active_tps={ACTIVE},
        tp_to_table={STANDBY: table, ACTIVE: table},
        standby_offsets=Counter(),
        stats=RestoreStats(),
        stale_records=0,
    )


async def test_a_standby_run_is_written_at_once_with_its_offset(store: Store) -> None:
    queue, flow = Queue(room=10), Flow()
    recovery = standby_recovery(store)
    backlog = ChangelogBacklog(app_with(queue, flow, recovery=recovery))
    mark = (None, 0)  # the partition's current fetch mark: no seek since its assignment
    backlog.add(STANDBY, [record(0, b"a", b"1"), record(1, b"b", b"2")], mark)
    backlog.add(ACTIVE, [record(7, b"x", b"9")], mark)
    backlog.add(STANDBY, [record(2, b"a", None), record(3, b"c", b"3")], mark)
    for _ in range(3):  # the fetch loop's rounds (a round stops at its slice)
        await backlog.feed()
    db = store._db_for_partition(1)
    assert (db.get(b"a"), db.get(b"b"), db.get(b"c")) == (None, b"2", b"3")
    assert store.persisted_offset(STANDBY) == 3
    assert recovery.standby_offsets[STANDBY] == 3
    assert recovery.stats.standby_records == 4
    # An active partition's records take faust's path, in their order.
    assert [(m.tp, m.record.offset) for m in queue.items] == [(ACTIVE, 7)]
    assert store._db_for_partition(2).get(b"x") is None
    assert not backlog


async def test_a_standby_run_skips_what_is_held_and_what_came_before_a_seek(
    store: Store,
) -> None:
    queue, flow = Queue(room=10), Flow()
    recovery = standby_recovery(store)
    db = store._db_for_partition(1)
    db[b"a"] = b"held"
    db[Store.offset_key] = b"4"
    backlog = ChangelogBacklog(app_with(queue, flow, recovery=recovery, seeks={STANDBY: 1}))
    # Fetched before the recovery sought the partition again: read again after it.
    backlog.add(STANDBY, [record(9, b"old", b"x")], (None, 0))
    backlog.add(STANDBY, [record(4, b"a", b"again"), record(5, b"d", b"5")], (None, 1))
    await backlog.feed()
    assert (db.get(b"a"), db.get(b"d"), db.get(b"old")) == (b"held", b"5", None)
    assert store.persisted_offset(STANDBY) == 5
    assert recovery.stale_records == 1
    assert recovery.stats.standby_records == 1
    assert queue.items == []


async def test_standby_runs_are_bounded_and_wait_for_faust_s_flow(
    store: Store, monkeypatch: Any
) -> None:
    monkeypatch.setattr(ChangelogBacklog, "standby_run", 3)
    queue, flow = Queue(room=10), Flow()
    recovery = standby_recovery(store)
    backlog = ChangelogBacklog(app_with(queue, flow, recovery=recovery))
    backlog.add(STANDBY, [record(n, b"k%d" % n, b"v") for n in range(7)], (None, 0))
    flow.active = False  # a rebalance: nothing is written until faust resumes its flow
    await backlog.feed()
    assert store.persisted_offset(STANDBY) is None
    flow.active = True
    await backlog.feed()
    assert store.persisted_offset(STANDBY) == 6
    assert recovery.stats.standby_records == 7
