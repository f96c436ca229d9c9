"""The engine's producers: the Kafka calls a task's cycle is made of, in no order of
their own (the engine puts them in order: :meth:`tables.engine.Engine._produce`).

* :class:`TransactionalProducer` (``exactly_once``): one per task, with the id
  ``<app id>-task-<partition>``. Starting it fences the producer of the partition's
  previous owner and aborts whatever transaction that one left open.
* :class:`SharedProducer` (``at_least_once``): the worker's idempotent producer, which
  every task sends through its own :class:`SharedView`.

Records leave as record batches of one partition each, no larger than their topic takes
(:func:`send_all`). When Kafka fails a batch, every batch of the send is awaited and the
failures are raised together (:class:`~tables.refusals.Undelivered`). aiokafka's
producer cannot send to a partition again after a failed batch (its sequence numbers
went on past it: the broker answers OutOfOrderSequenceNumber to everything after), so a
producer whose send failed is replaced (``reset``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.structs import TopicPartition

from core.topics import partition_for
from tables.engine import TP
from tables.limits import BATCH_HEADER_BYTES, MAX_REQUEST_BYTES, record_bytes_bound
from tables.pipeline import Output
from tables.refusals import Failure, SendPlan, Undelivered

logger = logging.getLogger(__name__)

#: The largest record batch the producer fills by itself.
MAX_BATCH_BYTES = 1024 * 1024


def producer_options(bootstrap: str) -> dict[str, Any]:
    return {
        "bootstrap_servers": bootstrap,
        "acks": "all",
        "enable_idempotence": True,
        "linger_ms": 5,
        "max_batch_size": MAX_BATCH_BYTES,
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


Sent = tuple[TP, list[Output], "asyncio.Future[Any]"]


async def _send_partition(
    producer: AIOKafkaProducer, tp: TP, records: Sequence[Output], limit: int, alone: bool
) -> list[Sent]:
    """Queue one partition's records as record batches of at most ``limit`` bytes (one
    record each when ``alone``): (partition, records, delivery) per batch."""
    sent: list[Sent] = []
    counted = limit < MAX_BATCH_BYTES  # else the producer's own batch size is the bound
    batch, members, size = producer.create_batch(), list[Output](), BATCH_HEADER_BYTES
    for out in records:
        grow = record_bytes_bound(out.key, out.value, out.headers) if counted else 0
        full = members and (alone or size + grow > limit)
        if not full and _append(batch, out):
            members.append(out)
            size += grow
            continue
        if members:
            future = await producer.send_batch(batch, tp.topic, partition=tp.partition)
            sent.append((tp, members, future))
            batch, members, size = producer.create_batch(), [], BATCH_HEADER_BYTES
        if not _append(batch, out):  # a batch takes its first record whatever its size
            raise ValueError(f"a record for {tp.topic} does not fit an empty record batch")
        members.append(out)
        size += grow
    if members:
        sent.append(
            (tp, members, await producer.send_batch(batch, tp.topic, partition=tp.partition))
        )
    return sent


async def send_all(
    producer: AIOKafkaProducer, outputs: Sequence[Output], plan: SendPlan
) -> dict[TP, int]:
    """Produce ``outputs`` as record batches of one partition each, and wait until Kafka
    holds them all. Returns the last offset written per partition; raises
    :class:`Undelivered` with every batch Kafka did not take."""
    limit: Callable[[str], int] = plan.batch_bytes or (lambda _topic: MAX_BATCH_BYTES)
    sent: list[Sent] = []
    for tp, records in (await _partitioned(producer, outputs)).items():
        alone = (tp.topic, tp.partition) in plan.isolate
        sent += await _send_partition(producer, tp, records, limit(tp.topic), alone)
    results = await asyncio.gather(*(future for _, _, future in sent), return_exceptions=True)
    written: dict[TP, int] = {}
    failures: list[Failure] = []
    taken: list[Output] = []
    for (tp, members, _), result in zip(sent, results, strict=True):
        if isinstance(result, BaseException):
            failures.append(Failure((tp.topic, tp.partition), result, members))
            continue
        written[tp] = max(written.get(tp, -1), result.offset + len(members) - 1)
        taken += members
    if failures:
        raise Undelivered(failures, len(sent) - len(failures), taken)
    return written


class TransactionalProducer:
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

    def _open(self) -> AIOKafkaProducer:
        if self._producer is None:
            raise RuntimeError(f"transactional producer {self.transactional_id} is not open")
        return self._producer

    async def send(self, records: Sequence[Output], plan: SendPlan) -> dict[TP, int]:
        return await send_all(self._open(), records, plan)

    def transaction(self) -> AbstractAsyncContextManager[Any]:
        context: AbstractAsyncContextManager[Any] = self._open().transaction()
        return context

    async def send_offsets(self, offsets: Mapping[TP, int]) -> None:
        commit = {TopicPartition(tp.topic, tp.partition): o for tp, o in offsets.items()}
        await self._open().send_offsets_to_transaction(commit, self.group_id)

    async def reset(self) -> None:
        """A new producer with the same transactional id: its start aborts what the old
        one left open."""
        await self.close()
        await self.open()

    async def close(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            await producer.stop()


class SharedProducer:
    """at_least_once: the worker's idempotent producer, started by the first task that
    opens a view of it and replaced after a failed send."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.producer: AIOKafkaProducer | None = None
        #: counts the producers started: a view that failed with one asks to replace
        #: that one only
        self.generation = 0
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        """Start the producer unless it runs."""
        async with self._lock:
            if self.producer is not None:
                return
            producer = AIOKafkaProducer(**producer_options(self.bootstrap))
            await producer.start()
            self.producer = producer
            self.generation += 1

    async def stop(self) -> None:
        producer, self.producer = self.producer, None
        if producer is not None:
            await producer.stop()

    async def reset(self, generation: int) -> None:
        """Replace the producer, unless it is no longer the one of ``generation``."""
        if generation != self.generation:
            return
        logger.info("the shared producer is replaced after a failed send")
        await self.stop()
        await self.start()

    def view(self) -> SharedView:
        return SharedView(self)


class SharedView:
    """at_least_once: a task's view of the worker's idempotent producer."""

    def __init__(self, shared: SharedProducer) -> None:
        self.shared = shared
        #: the producer generation a send of this task failed with, if any
        self._failed: int | None = None

    async def open(self) -> None:
        await self.shared.start()

    async def send(self, records: Sequence[Output], plan: SendPlan) -> dict[TP, int]:
        producer = self.shared.producer
        if producer is None:
            raise RuntimeError("the shared producer is not started")
        generation = self.shared.generation
        try:
            return await send_all(producer, records, plan)
        except Exception:
            self._failed = generation
            raise

    def transaction(self) -> AbstractAsyncContextManager[Any]:
        raise RuntimeError("the shared producer runs no transactions (at_least_once)")

    async def send_offsets(self, offsets: Mapping[TP, int]) -> None:
        raise RuntimeError("the shared producer runs no transactions (at_least_once)")

    async def reset(self) -> None:
        failed, self._failed = self._failed, None
        if failed is not None:
            await self.shared.reset(failed)

    async def close(self) -> None:
        await self.reset()
