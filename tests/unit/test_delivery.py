"""The order in which the at_least_once delivery hands a cycle to Kafka (a stand-in
producer records it): the outputs are acknowledged before any changelog record is sent."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from tables.delivery import SharedDelivery
from tables.pipeline import Output


class Batch:
    def __init__(self) -> None:
        self.records: list[Any] = []

    def append(self, **record: Any) -> object:
        self.records.append(record)
        return object()


class Producer:
    """Records each sent batch's topic; each is acknowledged when the test says so."""

    def __init__(self) -> None:
        self.sent: list[str] = []
        self.pending: list[asyncio.Future[Any]] = []

    async def partitions_for(self, topic: str) -> set[int]:
        return {0, 1}

    def create_batch(self) -> Batch:
        return Batch()

    async def send_batch(self, batch: Batch, topic: str, partition: int) -> asyncio.Future[Any]:
        self.sent.append(topic)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.pending.append(future)
        return future

    def acknowledge(self) -> None:
        for future in self.pending:
            if not future.done():
                future.set_result(type("Meta", (), {"offset": 0})())


def test_changelog_records_are_sent_only_once_kafka_holds_the_outputs() -> None:
    producer = Producer()
    shared = SimpleNamespace(producer=producer, generation=1)
    delivery = SharedDelivery(shared)  # type: ignore[arg-type]
    outputs = [Output("settled-sales", b"store-1", b"{}", 0)]
    state = [Output("streamstate-settling_buffer-changelog", b"s1", b"{}", 0)]

    async def run() -> list[str]:
        sending = asyncio.create_task(delivery.send(outputs, {}, state=state))
        await asyncio.sleep(0.05)
        before = list(producer.sent)  # the outputs are not acknowledged yet
        producer.acknowledge()
        await asyncio.sleep(0.05)
        producer.acknowledge()
        await sending
        assert producer.sent == ["settled-sales", "streamstate-settling_buffer-changelog"]
        return before

    assert asyncio.run(run()) == ["settled-sales"]
