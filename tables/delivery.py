"""How a task's batch cycles reach Kafka, under each processing guarantee.

``exactly_once``: every task has a transactional producer of its own, with the id
``<app id>-task-<partition>``. Starting it fences the producer of the partition's
previous owner and aborts whatever transaction that one left open, so the committed
offsets read afterwards are final. Each cycle's changelog records, output records and
source offsets commit in one transaction.

``at_least_once``: one idempotent producer serves every task. A cycle's records are
acknowledged before its offsets are committed (by the consumer group, once per engine
cycle); a crash in between processes the cycle again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.structs import TopicPartition

from tables.engine import TP
from tables.pipeline import Output

logger = logging.getLogger(__name__)

#: Largest request a producer sends; a repartition record is kept well below it.
MAX_REQUEST_BYTES = 4 * 1024 * 1024


def producer_options(bootstrap: str) -> dict[str, Any]:
    return {
        "bootstrap_servers": bootstrap,
        "acks": "all",
        "enable_idempotence": True,
        "linger_ms": 5,
        "max_batch_size": 1024 * 1024,
        "max_request_size": MAX_REQUEST_BYTES,
    }


async def _send_all(producer: AIOKafkaProducer, outputs: Sequence[Output]) -> dict[TP, int]:
    futures = []
    for out in outputs:
        futures.append(
            await producer.send(
                out.topic,
                out.value,
                key=out.key,
                partition=out.partition,
                timestamp_ms=out.timestamp_ms,
                headers=out.headers,
            )
        )
    written: dict[TP, int] = {}
    for metadata in await asyncio.gather(*futures):
        tp = TP(metadata.topic, metadata.partition)
        if metadata.offset > written.get(tp, -1):
            written[tp] = metadata.offset
    return written


class TransactionalDelivery:
    """exactly_once: one task's transactional producer."""

    def __init__(self, bootstrap: str, transactional_id: str, group_id: str) -> None:
        self.bootstrap = bootstrap
        self.transactional_id = transactional_id
        self.group_id = group_id
        self._producer: AIOKafkaProducer | None = None

    async def open(self) -> None:
        producer = AIOKafkaProducer(
            transactional_id=self.transactional_id, **producer_options(self.bootstrap)
        )
        await producer.start()
        self._producer = producer

    async def send(self, outputs: Sequence[Output], offsets: Mapping[TP, int]) -> dict[TP, int]:
        producer = self._producer
        if producer is None:
            raise RuntimeError(f"transactional producer {self.transactional_id} is not open")
        async with producer.transaction():
            written = await _send_all(producer, outputs)
            if offsets:
                commit = {TopicPartition(tp.topic, tp.partition): o for tp, o in offsets.items()}
                await producer.send_offsets_to_transaction(commit, self.group_id)
        return written

    async def close(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            await producer.stop()


class SharedDelivery:
    """at_least_once: a task's view of the worker's idempotent producer."""

    def __init__(self, producer: AIOKafkaProducer) -> None:
        self.producer = producer

    async def open(self) -> None:
        return None

    async def send(self, outputs: Sequence[Output], offsets: Mapping[TP, int]) -> dict[TP, int]:
        return await _send_all(self.producer, outputs)

    async def close(self) -> None:
        return None
