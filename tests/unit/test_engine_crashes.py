"""The engine crashed at every point of a batch cycle, in process, over the in-memory log
of tests/unit/test_engine.py: before Kafka takes the cycle, halfway through what Kafka
takes (at_least_once: records without a transaction; the outputs go first, then the
changelog records), after Kafka took it but before
the store has it, and after the store has it but before the offsets are committed.

The process dies there; a new one restores its tables from the changelogs, as faust's
recovery does from each partition's persisted changelog offset, and resumes from the
committed offsets. Under exactly_once the tables must equal a run without a crash;
under at_least_once no word may be under-counted.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import orjson
import pytest

from agents import settling
from agents.schemas import ITEM_EVENTS, PAYMENTS, SETTLED_SALES
from core.topics import POSITION_KEY
from streams.compile import compile_topology
from tables.engine import TP, Engine, EngineFailure
from tables.pipeline import Context, Output
from tables.refusals import SendPlan
from tests.unit.test_engine import (
    PARTITIONS,
    TEXTS,
    Log,
    LogConnector,
    LogProducer,
    MemoryTable,
    fetch,
    lines,
    run,
    word_engine,
)

POINTS = ("before_kafka", "halfway_into_kafka", "before_the_store", "before_the_commit")


class Crash(BaseException):
    """The process dies here (no handler of the engine's takes it for a failure)."""


@dataclass
class CrashingProducer(LogProducer):
    point: str = ""
    armed: bool = False
    #: halfway_into_kafka: the armed send (from 1) that Kafka takes half of
    nth: int = 1

    async def send(self, records: Sequence[Output], plan: SendPlan) -> dict[TP, int]:
        if self.armed and self.point == "before_kafka":
            raise Crash(self.point)
        if self.armed and self.point == "halfway_into_kafka" and self.pending is None:
            self.nth -= 1
            if self.nth == 0:
                await super().send(records[: len(records) // 2], plan)
                raise Crash(self.point)
        return await super().send(records, plan)


class CrashingTable(MemoryTable):
    armed = False

    def apply(
        self, partition: int, changes: Mapping[bytes, bytes | None], changelog_offset: int | None
    ) -> None:
        if self.armed:
            raise Crash("before_the_store")
        super().apply(partition, changes, changelog_offset)


@dataclass
class CrashingConnector(LogConnector):
    point: str = ""
    armed: bool = False
    nth: int = 1

    def producer(self, partition: int, *, transactional: bool) -> LogProducer:
        producer = CrashingProducer(self.log, self.fail, point=self.point, nth=self.nth)
        if not transactional:  # every task's view of one shared producer
            producer.broken = self.shared_broken
        self.producers.append(producer)
        return producer

    def __post_init__(self) -> None:
        self.producers: list[CrashingProducer] = []

    def arm(self, on: bool) -> None:
        self.armed = on
        for producer in self.producers:
            producer.armed = on

    async def commit(self, offsets: Mapping[TP, int]) -> None:
        if self.armed and self.point == "before_the_commit":
            raise Crash(self.point)
        await super().commit(offsets)


def recover(table: MemoryTable, log: Log) -> None:
    """faust's recovery: each partition reads its changelog past its persisted offset."""
    for tp, records in sorted(log.records.items()):
        if tp.topic != table.changelog_topic:
            continue
        done = table.offsets.get(tp.partition)
        tail = [r for r in records if done is None or r.offset > done]
        if tail:
            MemoryTable.apply(
                table, tp.partition, {r.key: r.value for r in tail if r.key}, tail[-1].offset
            )


def crash_at(
    engine: Engine,
    connector: CrashingConnector,
    at_cycle: int,
    *,
    limit: int,
    arm: Callable[[bool], None] = lambda armed: None,
) -> None:
    """Run fetch-and-process cycles (``limit`` records per partition) until the crash
    armed from cycle ``at_cycle`` on comes; ``arm`` arms what else may crash."""

    async def until_crash() -> None:
        for cycle in range(200):
            armed = cycle >= at_cycle
            connector.arm(armed)
            arm(armed)
            fetched = fetch(connector, sorted(engine.topics), limit)
            positions = {tp: connector.positions[tp] for tp in fetched}
            await engine.process(fetched, positions)
        raise AssertionError("the crash never came")

    with pytest.raises((Crash, EngineFailure)):
        asyncio.run(until_crash())


def crash_once(
    exactly_once: bool, point: str, at_cycle: int
) -> tuple[Counter[bytes], Log, MemoryTable]:
    log, table = Log(), CrashingTable("word_counts")
    want = lines(log, TEXTS)
    connector = CrashingConnector(log, exactly_once, point=point)
    engine = word_engine(connector, table)

    def arm(armed: bool) -> None:
        table.armed = armed and point == "before_the_store"

    crash_at(engine, connector, at_cycle, limit=2, arm=arm)
    table.armed = False
    # A new process on the same disk: restore, then resume from the committed offsets.
    recover(table, log)
    restarted = LogConnector(log, exactly_once)
    run(word_engine(restarted, table), restarted, limit=2, cycles=400)
    return want, log, table


@pytest.mark.parametrize("at_cycle", [0, 1, 3, 6, 10])
@pytest.mark.parametrize(
    "point", [p for p in POINTS if p not in ("halfway_into_kafka", "before_the_commit")]
)
def test_exactly_once_tables_are_exact_after_a_crash_at_any_point(
    point: str, at_cycle: int
) -> None:
    want, log, table = crash_once(True, point, at_cycle)
    assert table.values() == dict(want)
    # and the changelog, which a standby or a restore reads, says the same
    latest: dict[bytes, object] = {}
    for record in log.topic(table.changelog_topic):
        if record.key != POSITION_KEY and record.value is not None:
            latest[record.key] = orjson.loads(record.value)
    assert latest == dict(want)


@pytest.mark.parametrize("at_cycle", [0, 1, 3, 6, 10])
@pytest.mark.parametrize("point", POINTS)
def test_at_least_once_never_under_counts_after_a_crash_at_any_point(
    point: str, at_cycle: int
) -> None:
    want, log, table = crash_once(False, point, at_cycle)
    counted = table.values()
    assert set(counted) == set(want)
    assert all(int(counted[word]) >= n for word, n in want.items())  # type: ignore[call-overload]
    for tp, records in log.records.items():
        if tp.topic == "text-lines":
            assert log.committed[tp] == len(records)


# -- the join: its buffer dedupes by offset, so its outputs must not trail its state -----


def settling_log() -> tuple[Log, set[bytes]]:
    """Sales on one store's partition, each paid a minute later: the pairs to expect."""
    log, pairs = Log(), set()
    for n in range(40):
        sale = {
            "event_id": f"s{n}",
            "store_id": "store-1",
            "sku": "sku-1",
            "kind": "sale",
            "quantity": 1,
            "unit_price": 2.0,
            "ts": 1_000_000 + n * 1_000,
        }
        paid = {
            "payment_id": f"p{n}",
            "sale_event_id": f"s{n}",
            "store_id": "store-1",
            "amount": 2.0,
            "ts": 1_060_000 + n * 1_000,
        }
        log.append(TP(ITEM_EVENTS, 0), b"store-1", orjson.dumps(sale))
        log.append(TP(PAYMENTS, 0), b"store-1", orjson.dumps(paid))
        pairs.add(f"s{n}".encode())
    return log, pairs


def settled(log: Log) -> Counter[bytes]:
    return Counter(
        orjson.loads(r.value)["sale"]["event_id"].encode()
        for r in log.topic(SETTLED_SALES)
        if r.value is not None
    )


@pytest.mark.parametrize("nth", [1, 2])
@pytest.mark.parametrize("at_cycle", [1, 2, 4])
def test_at_least_once_settling_loses_no_pair_when_kafka_takes_half_a_cycle(
    at_cycle: int, nth: int
) -> None:
    """``nth``: the send Kafka takes half of (the outputs go first, then the changelog
    records)."""
    log, pairs = settling_log()
    context = Context(PARTITIONS, max_event_bytes=10_000, window_retention_ms=0)
    pipelines = compile_topology(settling.pipelines(context), context).pipelines
    names = {spec.name for pipeline in pipelines for spec in pipeline.writes}

    def engine(connector: LogConnector, tables: dict[str, MemoryTable]) -> Engine:
        return Engine(
            pipelines,
            tables,
            connector,
            partitions=PARTITIONS,
            exactly_once=connector.exactly_once,
        )

    tables = {name: MemoryTable(name) for name in names}
    connector = CrashingConnector(log, False, point="halfway_into_kafka", nth=nth)
    crash_at(engine(connector, tables), connector, at_cycle, limit=3)
    for table in tables.values():
        recover(table, log)
    restarted = LogConnector(log, False)
    run(engine(restarted, tables), restarted, limit=3, cycles=200)
    found = settled(log)
    assert set(found) == pairs, f"lost {sorted(pairs - set(found))}"
