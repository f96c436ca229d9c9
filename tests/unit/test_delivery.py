"""The order in which the engine hands a cycle to Kafka, under each guarantee (a stand-in
producer records each send and holds it until the test acknowledges it)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from tables.engine import TP, Engine
from tables.pipeline import Output
from tables.refusals import SendPlan
from tests.unit.test_engine import Log, LogConnector, LogProducer, MemoryTable, boom_on, fetch

CHANGELOG = MemoryTable("t").changelog_topic


@dataclass
class HeldProducer(LogProducer):
    """Each send waits until the test acknowledges it."""

    acknowledged: asyncio.Event = field(default_factory=asyncio.Event)
    in_transaction: list[bool] = field(default_factory=list)
    offsets_sent: list[Mapping[TP, int]] = field(default_factory=list)

    async def send(self, records: Sequence[Output], plan: SendPlan) -> dict[TP, int]:
        self.in_transaction.append(self.pending is not None)
        written = await super().send(records, plan)
        await self.acknowledged.wait()
        self.acknowledged.clear()
        return written

    async def send_offsets(self, offsets: Mapping[TP, int]) -> None:
        self.offsets_sent.append(dict(offsets))
        await super().send_offsets(offsets)


@dataclass
class HeldConnector(LogConnector):
    producers: list[HeldProducer] = field(default_factory=list)

    def producer(self, partition: int, *, transactional: bool) -> LogProducer:
        producer = HeldProducer(self.log, self.fail)
        self.producers.append(producer)
        return producer


def held_cycle(exactly_once: bool) -> tuple[HeldConnector, Engine]:
    log = Log()
    log.append(TP("in", 0), None, b"a")
    connector = HeldConnector(log, exactly_once)
    engine = Engine(
        [boom_on(b"never")],
        {"t": MemoryTable("t")},
        connector,
        partitions=1,
        exactly_once=exactly_once,
    )
    return connector, engine


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


def test_at_least_once_sends_the_changelog_only_once_kafka_holds_the_outputs() -> None:
    async def run() -> None:
        connector, engine = held_cycle(exactly_once=False)
        await engine.process(fetch(connector, ["in"], 10), {})  # the task starts
        cycle = asyncio.create_task(engine.process(fetch(connector, ["in"], 10), {}))
        await settle()
        [producer] = connector.producers
        assert producer.sends == [["out"]]  # the outputs are not acknowledged yet
        producer.acknowledged.set()
        await settle()
        assert producer.sends == [["out"], [CHANGELOG]]
        assert connector.log.committed == {}  # committed by the group, once Kafka holds all
        producer.acknowledged.set()
        await cycle
        assert producer.in_transaction == [False, False]
        assert connector.log.committed == {TP("in", 0): 1}
        assert connector.commits == 1

    asyncio.run(run())


def test_exactly_once_sends_changelogs_outputs_and_offsets_in_one_transaction() -> None:
    async def run() -> None:
        connector, engine = held_cycle(exactly_once=True)
        await engine.process(fetch(connector, ["in"], 10), {})  # the task starts
        cycle = asyncio.create_task(engine.process(fetch(connector, ["in"], 10), {}))
        await settle()
        [producer] = connector.producers
        assert producer.sends == [[CHANGELOG, "out"]]  # one send: changelogs, then outputs
        assert connector.log.records.keys() == {TP("in", 0)}  # nothing visible yet
        producer.acknowledged.set()
        await cycle
        assert producer.in_transaction == [True]
        assert producer.offsets_sent == [{TP("in", 0): 1}]
        assert connector.log.committed == {TP("in", 0): 1}
        assert connector.commits == 0  # not by the group
        assert [r.value for r in connector.log.topic("out")] == [b"seen"]

    asyncio.run(run())
