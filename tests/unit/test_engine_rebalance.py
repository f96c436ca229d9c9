"""A rebalance keeps the tasks of the partitions that come back (the eager protocol
revokes every partition at every rebalance); only those assigned elsewhere close."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest

from tables.engine import TP
from tests.unit.test_engine import (
    PARTITIONS,
    REPARTITION_TOPIC,
    TEXT_LINES,
    TEXTS,
    WORD_COUNTS,
    Log,
    LogConnector,
    LogProducer,
    MemoryTable,
    lines,
    offer_next,
    run,
    word_engine,
)

ALL = set(range(PARTITIONS))


def committed_everything(log: Log) -> bool:
    return all(
        log.committed.get(tp) == len(records)
        for tp, records in log.records.items()
        if tp.topic in (TEXT_LINES, REPARTITION_TOPIC)
    )


@pytest.mark.parametrize("exactly_once", [False, True])
def test_a_partition_that_comes_back_keeps_its_task_and_producer(exactly_once: bool) -> None:
    log, table = Log(), MemoryTable(WORD_COUNTS)
    want = lines(log, TEXTS[:10])
    connector = LogConnector(log, exactly_once)
    engine = word_engine(connector, table)
    run(engine, connector)
    before = dict(engine.tasks)
    producers = {p: task.producer for p, task in before.items()}
    assert set(before) == ALL

    asyncio.run(engine.suspend())  # revoked: every partition, as the eager protocol does
    more = lines(log, TEXTS[10:])
    asyncio.run(offer_next(engine, connector, 3, settled=False))  # fetched mid-rebalance
    asyncio.run(engine.keep(ALL))  # the same partitions assigned again
    connector.positions.clear()  # the consumer starts again from the committed offsets
    run(engine, connector)

    assert engine.tasks == before
    assert {p: t.producer for p, t in engine.tasks.items()} == producers
    assert table.values() == dict(want + more)
    assert committed_everything(log)


@pytest.mark.parametrize("exactly_once", [False, True])
def test_a_partition_assigned_elsewhere_closes_its_task(exactly_once: bool) -> None:
    log, table = Log(), MemoryTable(WORD_COUNTS)
    lines(log, TEXTS)
    connector = LogConnector(log, exactly_once)
    engine = word_engine(connector, table)
    run(engine, connector)
    kept = engine.tasks[0]

    asyncio.run(engine.suspend())
    asyncio.run(engine.keep({0}))
    assert engine.tasks == {0: kept}


def test_a_kept_task_the_group_committed_past_starts_again_from_the_committed_offsets() -> None:
    # This worker's session timed out: another worker applied and committed partition 1
    # in a generation without it, then the partition came back.
    log, table = Log(), MemoryTable(WORD_COUNTS)
    lines(log, TEXTS[:10])
    connector = LogConnector(log, exactly_once=False)
    engine = word_engine(connector, table)
    run(engine, connector)
    stale = engine.tasks[1]
    asyncio.run(engine.suspend())
    asyncio.run(engine.keep(ALL))
    elsewhere = TP(TEXT_LINES, 1)
    log.append(elsewhere, None, b"applied elsewhere")
    log.committed[elsewhere] = len(log.records[elsewhere])
    lines(log, TEXTS[10:])
    connector.positions.clear()
    run(engine, connector)

    assert engine.tasks[1] is not stale
    assert engine.tasks[0] is not None
    assert committed_everything(log)


@dataclass
class SlowOpening(LogProducer):
    """A producer whose start takes a while (a transactional one finds its coordinator
    and fences its predecessor), counting how many start at once."""

    starting: list[int] = field(default_factory=lambda: [0, 0])  # now, at most

    async def open(self) -> None:
        self.starting[0] += 1
        self.starting[1] = max(self.starting[1], self.starting[0])
        for _ in range(3):
            await asyncio.sleep(0)
        self.starting[0] -= 1
        await super().open()


@dataclass
class SlowConnector(LogConnector):
    starting: list[int] = field(default_factory=lambda: [0, 0])

    def producer(self, partition: int, *, transactional: bool) -> LogProducer:
        return SlowOpening(self.log, self.fail, starting=self.starting)


def test_the_partitions_a_rebalance_brings_start_their_tasks_together() -> None:
    log, table = Log(), MemoryTable(WORD_COUNTS)
    want = lines(log, TEXTS)
    connector = SlowConnector(log, exactly_once=True)
    engine = word_engine(connector, table)
    run(engine, connector)
    assert connector.starting == [0, PARTITIONS]
    assert table.values() == dict(want)


@dataclass
class CountedProducer(LogProducer):
    closed: int = 0
    #: what every producer of the connector did, in order: ("open" or "close", id)
    order: list[tuple[str, int]] = field(default_factory=list)

    async def open(self) -> None:
        await asyncio.sleep(0)  # a start takes a while (it finds its coordinator)
        self.order.append(("open", id(self)))
        await super().open()

    async def close(self) -> None:
        self.order.append(("close", id(self)))
        self.closed += 1
        await super().close()


@dataclass
class MakingConnector(LogConnector):
    """Keeps every producer it makes, per partition, and counts the reads of committed
    offsets."""

    made: dict[int, list[CountedProducer]] = field(default_factory=dict)
    reads: int = 0
    order: list[tuple[str, int]] = field(default_factory=list)

    def producer(self, partition: int, *, transactional: bool) -> CountedProducer:
        producer = CountedProducer(self.log, self.fail, order=self.order)
        self.made.setdefault(partition, []).append(producer)
        return producer

    async def committed(self, tps: Sequence[TP]) -> dict[TP, int | None]:
        self.reads += 1
        return await super().committed(tps)


def test_an_assignment_opens_its_new_partitions_producers_for_their_tasks() -> None:
    """exactly_once: the producers of the partitions an assignment brings open as it
    comes, and their committed offsets are read then, beside the recovery; a task takes
    its partition's; the next assignment closes every one not taken and opens its own."""
    log, table = Log(), MemoryTable(WORD_COUNTS)
    lines(log, TEXTS)
    connector = MakingConnector(log, exactly_once=True)
    engine = word_engine(connector, table)

    async def settle() -> None:
        for _ in range(20):
            await asyncio.sleep(0)

    async def go() -> None:
        await engine.keep({0, 1})
        await settle()
        assert {p: [x.opened for x in made] for p, made in connector.made.items()} == {
            0: [1],
            1: [1],
        }
        assert connector.reads == 2
        await engine.keep({0})  # partition 1 went elsewhere before its task started
        await settle()
        assert connector.made[1][0].closed == 1
        assert connector.made[0][0].closed == 1
        assert connector.reads == 3
        for _ in range(20):
            await offer_next(engine, connector, 3)

    asyncio.run(go())
    producer = connector.made[0][-1]
    assert engine.tasks[0].producer is producer
    assert (len(connector.made[0]), producer.opened, producer.closed) == (2, 1, 0)


def test_an_assignment_right_after_another_closes_its_producers_before_opening_its_own() -> None:
    """A producer still starting would fence the next one of its transactional id."""
    log, table = Log(), MemoryTable(WORD_COUNTS)
    connector = MakingConnector(log, exactly_once=True)
    engine = word_engine(connector, table)

    async def go() -> None:
        await engine.keep({0})
        await engine.keep({0})  # before the first assignment's producer has started
        for _ in range(20):
            await asyncio.sleep(0)

    asyncio.run(go())
    first, second = (id(producer) for producer in connector.made[0])
    assert connector.order.index(("close", first)) < connector.order.index(("open", second))


def test_a_rebalance_of_a_running_member_caps_its_fetches_until_the_backlog_is_worked_off() -> None:
    log, table = Log(), MemoryTable(WORD_COUNTS)
    lines(log, TEXTS[:10])
    connector = LogConnector(log, False)
    engine = word_engine(connector, table)
    asyncio.run(engine.keep(ALL))  # the member's first assignment: no cycle before it
    assert engine.catch_up.cap() is None
    run(engine, connector)
    usual = engine.catch_up.usual
    assert usual is not None
    assert usual > 0  # the cycles' records per partition

    asyncio.run(engine.suspend())
    asyncio.run(engine.keep(ALL))
    assert engine.catch_up.cap() == max(100, int(2 * usual))
    engine.catch_up.fetched(left_behind=False)
    assert engine.catch_up.cap() is None
