"""Stateless stages that read a source topic directly, outside faust's streams.

faust hands an agent its records one by one, each made into a Message and an Event and
passed through the consumer's queues. For the word count's first stage (split lines
into words, count them per batch, send the counts on by word) that per-record path was
nearly all of the worker's time. A stage that keeps no table needs none of what faust's
group gives (tables, standbys, co-partitioning): its output goes to a repartition topic
that faust's agents read. Such a stage runs as a service of the worker, with a consumer
group of its own (``<app id>-<stage>``, :func:`app.topics.source_groups`), and works
on each fetched partition batch as a whole: ``getmany``, one :class:`PartitionBatch`
per partition, its outputs sent, its offset committed. Workers share the source
partitions through that group as they share the others through faust's.

``at_least_once``: the outputs go to the stage's idempotent producer; once every one is
acknowledged the offsets are committed. A crash in between sends the batch again. The
next fetch is worked on while a batch's outputs are acknowledged and its offsets
committed, and sent once that is done: one batch is in flight at a time.

``exactly_once``: every assigned partition has a transactional producer of its own,
``<group>-<topic>-<partition>``, started when the partition is assigned, which fences
the producer of its previous owner. A batch's outputs and its next offset commit in one
transaction. After the producers have fenced the previous owners, the partitions are
sought to their committed offsets again: the offsets aiokafka fetched at the assignment
may predate a transaction the previous owner was still committing. The consumer reads
``read_committed``.

A revocation waits for the batch in flight to be committed. A batch that fails stops the
worker (nothing is skipped); a restart resumes from the committed offsets.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import ConsumerStoppedError
from mode import Service

from app.metrics import count_events
from app.settings import Settings
from tables.batch import PartitionBatch, send_output

logger = logging.getLogger(__name__)

#: Builds the batch of one partition's fetched records (offsets ascending, none empty).
Build = Callable[[TopicPartition, list[Any]], PartitionBatch]

#: Largest request the stage's producers send (a repartition record is kept well below).
MAX_REQUEST_BYTES = 4 * 1024 * 1024


class _Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, source: DirectSource) -> None:
        self.source = source

    async def on_partitions_revoked(self, revoked: Iterable[TopicPartition]) -> None:
        await self.source.revoked(set(revoked))

    async def on_partitions_assigned(self, assigned: Iterable[TopicPartition]) -> None:
        await self.source.assigned(set(assigned))


class DirectSource(Service):
    """One stateless stage over one source topic, with its own consumer group."""

    def __init__(
        self,
        *,
        app: Any,
        settings: Settings,
        topic: str,
        group: str,
        name: str,
        build: Build,
        **kwargs: Any,
    ) -> None:
        self.faust_app = app
        self.settings = settings
        self.topic = topic
        self.group = group
        self.name = name
        self.build = build
        self.exactly_once = settings.processing_guarantee == "exactly_once"
        self._consumer: AIOKafkaConsumer | None = None
        #: at_least_once: one idempotent producer for every partition
        self._producer: AIOKafkaProducer | None = None
        #: exactly_once: the transactional producer of each assigned partition
        self._producers: dict[TopicPartition, AIOKafkaProducer] = {}
        #: held from the end of a fetch until its batches are sent (exactly_once:
        #: committed)
        self._busy = asyncio.Lock()
        #: at_least_once: the acknowledgements and the commit of the last batch sent
        self._finishing: asyncio.Task[None] | None = None
        #: per partition, the offset after the last committed batch
        self.committed: dict[TopicPartition, int] = {}
        super().__init__(**kwargs)

    # -- lifecycle --------------------------------------------------------------------

    def _producer_options(self) -> dict[str, Any]:
        return {
            "bootstrap_servers": self.settings.bootstrap_servers,
            "acks": "all",
            "enable_idempotence": True,
            "linger_ms": 5,
            "max_batch_size": 1024 * 1024,
            "max_request_size": MAX_REQUEST_BYTES,
        }

    async def on_start(self) -> None:
        settings = self.settings
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=settings.bootstrap_servers,
            group_id=self.group,
            client_id=self.group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_committed" if self.exactly_once else "read_uncommitted",
            max_partition_fetch_bytes=4 * 1024 * 1024,
            fetch_max_bytes=32 * 1024 * 1024,
            session_timeout_ms=int(settings.broker_session_timeout * 1000),
            heartbeat_interval_ms=int(settings.broker_heartbeat_interval * 1000),
            rebalance_timeout_ms=int(settings.broker_rebalance_timeout * 1000),
        )
        self._consumer.subscribe([self.topic], listener=_Rebalance(self))
        if not self.exactly_once:
            self._producer = AIOKafkaProducer(**self._producer_options())
            await self._producer.start()
        await self._consumer.start()
        self.add_future(self._run())

    async def on_stop(self) -> None:
        async with self._busy:  # the batch in flight commits first
            with contextlib.suppress(Exception):  # a failure was logged and stops the worker
                await self._finished()
            consumer, self._consumer = self._consumer, None
            if consumer is not None:
                await consumer.stop()
            await self._stop_producers(list(self._producers))
            if self._producer is not None:
                await self._producer.stop()
                self._producer = None

    # -- rebalances -------------------------------------------------------------------

    async def revoked(self, revoked: set[TopicPartition]) -> None:
        async with self._busy:
            await self._finished()
            await self._stop_producers(revoked)
            for tp in revoked:
                self.committed.pop(tp, None)

    async def assigned(self, assigned: set[TopicPartition]) -> None:
        try:
            await self._assigned(assigned)
        except Exception as exc:
            # Under exactly_once a partition without its producer would never be read.
            await self._stop_worker("the new partitions could not be set up", exc)

    async def _assigned(self, assigned: set[TopicPartition]) -> None:
        consumer = self._consumer
        if consumer is None:
            return
        logger.info("%s: assigned %s", self.name, sorted(tp.partition for tp in assigned))
        new = [tp for tp in sorted(assigned) if tp not in self.committed]
        if self.exactly_once:
            await self._stop_producers(set(self._producers) - assigned)
            await asyncio.gather(
                *(self._start_producer(tp) for tp in new if tp not in self._producers)
            )
        for tp in new:
            # exactly_once: fenced now, so what the previous owner committed is final.
            committed = await consumer.committed(tp)
            if self.exactly_once:
                if committed is None:
                    await consumer.seek_to_beginning(tp)
                else:
                    consumer.seek(tp, committed)
            self.committed[tp] = committed or 0

    def transactional_id(self, tp: TopicPartition) -> str:
        return f"{self.group}-{tp.topic}-{tp.partition}"

    async def _start_producer(self, tp: TopicPartition) -> None:
        producer = AIOKafkaProducer(
            transactional_id=self.transactional_id(tp), **self._producer_options()
        )
        await producer.start()
        self._producers[tp] = producer

    async def _stop_producers(self, tps: Iterable[TopicPartition]) -> None:
        stopping = [self._producers.pop(tp) for tp in list(tps) if tp in self._producers]
        await asyncio.gather(*(producer.stop() for producer in stopping))

    # -- batches ----------------------------------------------------------------------

    async def _run(self) -> None:
        max_records = self.settings.source_fetch_max_records
        while not self.should_stop:
            consumer = self._consumer
            if consumer is None:
                return
            try:
                fetched = await consumer.getmany(timeout_ms=500, max_records=max_records)
            except ConsumerStoppedError:
                return
            if not fetched:
                continue
            async with self._busy:
                try:
                    await self._process(fetched)
                except Exception as exc:
                    await self._stop_worker("a batch failed", exc)
                    return

    def _pending(self, fetched: dict[TopicPartition, list[Any]]) -> dict[TopicPartition, list[Any]]:
        """Records of partitions still assigned, none before a committed offset."""
        assert self._consumer is not None
        assignment = self._consumer.assignment()
        pending = {}
        for tp, records in fetched.items():
            if tp not in assignment:
                continue  # revoked since the fetch: the new owner reads them
            start = self.committed.get(tp)
            if start is None:
                if self.exactly_once:
                    # Its producer is still being set up; the partition is sought to its
                    # committed offset once it is, and these records come again.
                    continue
                start = 0
            if records[0].offset >= start:
                kept = records  # the usual case: nothing of it committed yet
            else:  # fetched again after a seek back
                kept = [record for record in records if record.offset >= start]
            if kept:
                pending[tp] = kept
        return pending

    async def _process(self, fetched: dict[TopicPartition, list[Any]]) -> None:
        pending = self._pending(fetched)
        if not pending:
            return
        if self.exactly_once:
            await asyncio.gather(*(self._in_transaction(tp, rs) for tp, rs in pending.items()))
        else:
            await self._at_least_once(pending)
        count_events(self.name, sum(len(records) for records in pending.values()))

    async def _finished(self) -> None:
        """Wait until the last batch sent is acknowledged and committed; raise its error."""
        finishing, self._finishing = self._finishing, None
        if finishing is not None:
            await finishing

    async def _at_least_once(self, pending: dict[TopicPartition, list[Any]]) -> None:
        producer = self._producer
        assert producer is not None
        # Built while the previous batch's outputs are acknowledged and committed...
        batches = [self.build(tp, records) for tp, records in pending.items()]
        # ...and sent once that is done: one batch in flight.
        await self._finished()
        sends = [await send_output(producer, out) for batch in batches for out in batch.outputs]
        offsets = {batch.tp: batch.last_offset + 1 for batch in batches}
        self._finishing = asyncio.ensure_future(self._commit(sends, offsets))

    async def _commit(
        self, sends: list[asyncio.Future[Any]], offsets: dict[TopicPartition, int]
    ) -> None:
        try:
            await asyncio.gather(*sends)
            consumer = self._consumer
            assert consumer is not None
            await consumer.commit(offsets)
        except Exception as exc:
            await self._stop_worker("a batch was not delivered or not committed", exc)
            raise
        self.committed.update(offsets)

    async def _in_transaction(self, tp: TopicPartition, records: list[Any]) -> None:
        producer = self._producers.get(tp)
        if producer is None:
            raise RuntimeError(f"{self.name}: no transactional producer for {tp}")
        batch = self.build(tp, records)
        offset = batch.last_offset + 1
        async with producer.transaction():
            sends = [await send_output(producer, out) for out in batch.outputs]
            await asyncio.gather(*sends)
            await producer.send_offsets_to_transaction({tp: offset}, self.group)
        self.committed[tp] = offset

    async def _stop_worker(self, what: str, exc: Exception) -> None:
        """Log ``what`` went wrong and crash the worker: nothing is skipped, and a restart
        resumes from the committed offsets."""
        logger.exception(
            "%s: %s; the worker stops and a restart resumes from the committed offsets",
            self.name,
            what,
        )
        await self.faust_app.crash(exc)

    # -- figures ----------------------------------------------------------------------

    def lag(self) -> dict[TopicPartition, int]:
        """Records between the end of each assigned partition and its committed offset."""
        consumer = self._consumer
        if consumer is None:
            return {}
        lag = {}
        for tp in consumer.assignment():
            highwater = consumer.highwater(tp)
            if highwater is not None:
                lag[tp] = max(0, highwater - self.committed.get(tp, 0))
        return lag
