"""How a task's batch cycles reach Kafka, under each processing guarantee.

``exactly_once``: every task has a transactional producer of its own, with the id
``<app id>-task-<partition>``. Starting it fences the producer of the partition's
previous owner and aborts whatever transaction that one left open, so the committed
offsets read afterwards are final. Each cycle's changelog records, output records and
source offsets commit in one transaction.

``at_least_once``: one idempotent producer serves every task. A cycle's outputs are
acknowledged, then its changelog records, then its offsets are committed (by the consumer
group, once per engine cycle); a crash in between processes the cycle again, and sends
its outputs again rather than losing them.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
from collections.abc import Mapping, Sequence
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.structs import TopicPartition

from core.topics import partition_for
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


@functools.lru_cache(maxsize=1 << 16)
def _keyed_partition(key: bytes, partitions: int) -> int:
    """The default partitioner's choice for a keyed record (murmur2, as the Java client)."""
    return partition_for(key, partitions)


async def _partitioned(
    producer: AIOKafkaProducer, outputs: Sequence[Output]
) -> dict[TP, list[Output]]:
    """The outputs grouped by the partition they go to, in order."""
    counts: dict[str, int] = {}
    grouped: dict[tuple[str, int], list[Output]] = {}
    for out in outputs:
        partition = out.partition
        if partition is None:
            count = counts.get(out.topic)
            if count is None:
                count = counts[out.topic] = len(await producer.partitions_for(out.topic))
            if out.key is None:
                partition = random.randrange(count)
            else:
                partition = _keyed_partition(out.key, count)
        group = grouped.get((out.topic, partition))
        if group is None:
            group = grouped[(out.topic, partition)] = []
        group.append(out)
    return {TP(topic, partition): group for (topic, partition), group in grouped.items()}


def _append(batch: Any, out: Output) -> bool:
    appended = batch.append(
        key=out.key, value=out.value, timestamp=out.timestamp_ms, headers=out.headers or []
    )
    return appended is not None


async def _send_partition(
    producer: AIOKafkaProducer, tp: TP, records: Sequence[Output]
) -> list[tuple[int, asyncio.Future[Any]]]:
    """Queue one partition's records as record batches: (records, delivery) per batch."""
    sent: list[tuple[int, asyncio.Future[Any]]] = []
    batch, count = producer.create_batch(), 0
    for out in records:
        if not _append(batch, out):  # the batch is full: send it, start the next
            if count:
                sent.append(
                    (count, await producer.send_batch(batch, tp.topic, partition=tp.partition))
                )
                batch, count = producer.create_batch(), 0
            if not _append(batch, out):
                raise ValueError(f"a record for {tp.topic} exceeds the producer's batch size")
        count += 1
    sent.append((count, await producer.send_batch(batch, tp.topic, partition=tp.partition)))
    return sent


async def _send_all(producer: AIOKafkaProducer, outputs: Sequence[Output]) -> dict[TP, int]:
    """Produce ``outputs`` as one record batch per partition (more when a batch fills),
    and wait until Kafka holds them all. Returns the last offset written per partition."""
    sent: list[tuple[TP, int, asyncio.Future[Any]]] = []
    for tp, records in (await _partitioned(producer, outputs)).items():
        sent += [(tp, n, future) for n, future in await _send_partition(producer, tp, records)]
    written: dict[TP, int] = {}
    for tp, count, future in sent:
        metadata = await future
        written[tp] = max(written.get(tp, -1), metadata.offset + count - 1)
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

    async def send(
        self, outputs: Sequence[Output], offsets: Mapping[TP, int], state: Sequence[Output] = ()
    ) -> dict[TP, int]:
        producer = self._producer
        if producer is None:
            raise RuntimeError(f"transactional producer {self.transactional_id} is not open")
        async with producer.transaction():
            written = await _send_all(producer, [*state, *outputs])
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

    async def send(
        self, outputs: Sequence[Output], offsets: Mapping[TP, int], state: Sequence[Output] = ()
    ) -> dict[TP, int]:
        # The outputs first: state that lands without them would make the records that
        # produced them look applied when they are processed again (see Delivery.send).
        written = await _send_all(self.producer, outputs) if outputs else {}
        if state:
            written.update(await _send_all(self.producer, state))
        return written

    async def close(self) -> None:
        return None
