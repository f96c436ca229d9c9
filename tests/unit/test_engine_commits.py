"""The engine's rules for the group's commit and for a stop, over the in-process log of
tests/unit/test_engine.py: a commit the group refuses because it rebalanced is no
failure; a commit that fails closes every task, and they start again from the committed
offsets; at a stop the cycle in flight gets its time to take effect, then is cut short."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pytest

from agents.schemas import TEXT_LINES
from agents.words import WORD_COUNTS
from tables import engine as engine_module
from tables.engine import TP, CommitRefused
from tables.pipeline import Output
from tables.refusals import SendPlan
from tests.unit.test_engine import (
    REPARTITION_TOPIC,
    TEXTS,
    Log,
    LogConnector,
    LogProducer,
    MemoryTable,
    fetch,
    lines,
    offer_next,
    run,
    word_engine,
)


@dataclass
class RefusingCommits(LogConnector):
    """The group's commit fails ``times`` times with ``error``."""

    error: Exception = field(default_factory=lambda: CommitRefused("a rebalance"))
    times: int = 1

    async def commit(self, offsets: Mapping[TP, int]) -> None:
        if self.times > 0:
            self.times -= 1
            raise self.error
        await super().commit(offsets)


def committed_texts(log: Log) -> dict[TP, int]:
    return {tp: o for tp, o in log.committed.items() if tp.topic == TEXT_LINES}


def test_a_commit_the_group_refuses_is_no_failure_and_the_tasks_go_on() -> None:
    log, table = Log(), MemoryTable(WORD_COUNTS)
    want = lines(log, TEXTS)
    connector = RefusingCommits(log, exactly_once=False)
    engine = word_engine(connector, table)

    async def first() -> None:
        await offer_next(engine, connector, 3)  # the tasks start
        await offer_next(engine, connector, 3)  # their first cycle: the commit is refused

    asyncio.run(first())
    assert connector.times == 0
    assert committed_texts(log) == {}
    assert sorted(engine.tasks) == [0, 1]  # kept: nothing is applied twice here
    assert engine.stalled() == []
    run(engine, connector)
    assert table.values() == dict(want)
    assert committed_texts(log) == {
        TP(TEXT_LINES, p): len(log.records[TP(TEXT_LINES, p)]) for p in (0, 1)
    }


def test_a_commit_that_fails_closes_every_task_and_they_start_from_the_committed_offsets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(engine_module, "KAFKA_RETRY_S", 0.0)
    log, table = Log(), MemoryTable(WORD_COUNTS)
    want = lines(log, TEXTS)
    connector = RefusingCommits(log, exactly_once=False, error=ConnectionError("gone"))
    engine = word_engine(connector, table)

    async def first() -> dict[TP, int]:
        await offer_next(engine, connector, 3)  # the tasks start
        fetched = fetch(connector, sorted(engine.topics), 3)
        await engine.offer(fetched, {tp: connector.positions[tp] for tp in fetched})
        return {tp: rs[0].offset for tp, rs in fetched.items() if rs}

    firsts = asyncio.run(first())
    assert engine.tasks == {}
    assert engine.failure is None
    assert all(connector.positions[tp] == offset for tp, offset in firsts.items())
    run(engine, connector)
    counted = table.values()
    assert all(int(counted[word]) >= n for word, n in want.items())  # type: ignore[call-overload]
    assert committed_texts(log) == {
        TP(TEXT_LINES, p): len(log.records[TP(TEXT_LINES, p)]) for p in (0, 1)
    }


@dataclass
class Stuck(LogProducer):
    """Kafka takes nothing until ``go`` is set."""

    go: asyncio.Event | None = None

    async def send(self, records: Sequence[Output], plan: SendPlan) -> dict[TP, int]:
        assert self.go is not None
        await self.go.wait()
        return await super().send(records, plan)


@dataclass
class StuckConnector(LogConnector):
    go: asyncio.Event | None = None

    def producer(self, partition: int, *, transactional: bool) -> LogProducer:
        return Stuck(self.log, self.fail, go=self.go)


@pytest.mark.parametrize("answers", [True, False])
def test_a_stop_waits_for_the_cycle_in_flight_then_cuts_it_short(
    answers: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``answers``: Kafka takes the cycle within the wait after the stop."""
    monkeypatch.setattr(engine_module, "STOP_WAIT_S", 0.2)
    log, table = Log(), MemoryTable(WORD_COUNTS)
    lines(log, TEXTS[:4])

    async def go() -> None:
        connector = StuckConnector(log, exactly_once=True, go=asyncio.Event())
        engine = word_engine(connector, table)
        await offer_next(engine, connector, 10)  # the tasks start
        offering = asyncio.create_task(offer_next(engine, connector, 10))
        await asyncio.sleep(0.05)
        assert any(task.waiting for task in engine.tasks.values())
        offering.cancel()  # the worker stops
        if answers:
            await asyncio.sleep(0.05)
            assert connector.go is not None
            connector.go.set()
        with pytest.raises(asyncio.CancelledError):
            await offering

    asyncio.run(go())
    if answers:  # the cycle took effect as a whole: its repartition records and offsets
        assert committed_texts(log) == {TP(TEXT_LINES, p): 2 for p in (0, 1)}
        assert log.topic(REPARTITION_TOPIC)
    else:  # cut short, as a kill -9: nothing of it took effect
        assert committed_texts(log) == {}
        assert not log.topic(REPARTITION_TOPIC)
