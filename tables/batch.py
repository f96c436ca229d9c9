"""Processing a fetched batch of one source partition as a unit, under both guarantees.

An agent that reads with ``stream.take_events`` hands each source partition's run of
events to :meth:`BatchProcessor.apply` as one :class:`PartitionBatch`: the table values
it sets (already aggregated, one write per key) and the records it produces. Work per
batch instead of per event is what makes the word count fast: one changelog record and
one RocksDB write per distinct word of a batch instead of one per occurrence.

Offsets: the consumer commits a source offset only once :meth:`apply` has recorded the
batch that contains it as applied (:class:`CommitGate`). faust's ``take_events`` acks a
batch's events even when its processing raised, so acks alone would let a commit skip
over a batch that never took effect.

``exactly_once``: the batch's changelog records, output records and the source offset go
to the source partition's transactional producer (the one faust fences by its
``{app}-{group}-{partition}`` id on every rebalance) and commit in one transaction,
under the lock faust's own commit takes for that producer. RocksDB is written after the
commit, so local state never holds what Kafka aborted; a kill -9 between the two leaves
local state behind the changelog, and the worker discards it at the next start
(``tables/checkpoint.py``).

A source topic that another agent of the app reads too (:meth:`BatchProcessor.share`)
has one committed offset for both: a batch commits it no further than the other reader
has put its results in the same transactional producer, and records its own applied
offset in the ``batch_offsets`` table in the same transaction. After a restart or a
move, the events between the committed offset and that applied offset are fetched again
and left out here (the other reader skips what it had done in the same way).

``at_least_once``: RocksDB first, then the changelog through the table (which keeps the
persisted changelog offset that a restart resumes from) and the outputs through the
producer; faust flushes the producer before it commits the gated offsets.

A batch that fails leaves its partition poisoned: nothing later of that partition is
applied or committed, and the worker crashes, so a restart resumes from the last
applied batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import faust
from faust.types.enums import ProcessingGuarantee
from rocksdict import WriteBatch

from tables.transactions import in_transaction, transactional_id

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Output:
    """A record a batch produces, serialized."""

    topic: str
    key: bytes | None
    value: bytes | None
    partition: int | None = None
    timestamp_ms: int | None = None
    headers: list[tuple[str, bytes]] | None = None


@dataclass
class PartitionBatch:
    """What the events of one source partition, up to ``last_offset``, produced."""

    tp: Any
    last_offset: int
    #: table -> encoded key -> encoded value (None deletes), in the table partition
    #: numbered like the source partition.
    writes: dict[Any, dict[bytes, bytes | None]] = field(default_factory=dict)
    outputs: list[Output] = field(default_factory=list)

    def set(self, table: Any, key: bytes, value: bytes | None) -> None:
        self.writes.setdefault(table, {})[key] = value

    def send(self, output: Output) -> None:
        self.outputs.append(output)


async def send_output(producer: Any, out: Output) -> Any:
    """Hand ``out`` to an aiokafka producer; return the future of its delivery."""
    return await producer.send(
        out.topic,
        out.value,
        key=out.key,
        partition=out.partition,
        timestamp_ms=out.timestamp_ms,
        headers=out.headers,
    )


def by_partition(events: Iterable[Any]) -> dict[Any, list[Any]]:
    """Events grouped by source partition, each group in offset order."""
    groups: dict[Any, list[Any]] = defaultdict(list)
    for event in events:
        groups[event.message.tp].append(event)
    return groups


def read(table: Any, partition: int, key: bytes) -> bytes | None:
    """The encoded value of ``key`` in one partition of a RocksDB table."""
    value: bytes | None = table.data._db_for_partition(partition).get(key)
    return value


def encode_value(table: Any, value: Any) -> bytes | None:
    encoded: bytes | None = table.data._encode_value(value)
    return encoded


def decode_value(table: Any, value: bytes | None) -> Any:
    return table.data._decode_value(value)


class CommitGate:
    """Keeps the consumer from committing past what :class:`BatchProcessor` applied.

    Installed on the app's consumer: for the gated topics, the committable offset of a
    partition is at most the one after the last applied batch, and nothing once the
    partition is poisoned.
    """

    def __init__(self) -> None:
        self.topics: set[str] = set()
        self.applied: dict[Any, int] = {}
        self.poisoned: set[Any] = set()
        #: exactly_once: batches commit their offsets themselves.
        self.own_commits = False
        #: topics other agents read too: under exactly_once faust's commit may also commit
        #: them, as far as both its acks (every reader's) and the applied batches go
        self.shared: set[str] = set()
        self._installed: Any = None

    def install(self, consumer: Any) -> None:
        if self._installed is consumer:
            return
        original = consumer._filter_committable_offsets

        def filter_committable_offsets(tps: Iterable[Any]) -> dict[Any, int]:
            offsets: dict[Any, int] = original(tps)
            for tp in list(offsets):
                if tp.topic not in self.topics:
                    continue
                applied = self.applied.get(tp)
                own = self.own_commits and tp.topic not in self.shared
                if own or applied is None or tp in self.poisoned:
                    # Under exactly_once each batch commits its own offset in its
                    # transaction; nothing else may (but for shared topics).
                    del offsets[tp]
                    continue
                offset = min(offsets[tp], applied)
                if consumer._should_commit(tp, offset):
                    offsets[tp] = offset
                else:
                    del offsets[tp]
            return offsets

        consumer._filter_committable_offsets = filter_committable_offsets
        self._installed = consumer

    def forget(self, tps: Iterable[Any]) -> None:
        """Partitions revoked. What was applied stays known: events fetched before the
        revocation and fetched again after a new assignment are not applied twice."""
        for tp in tps:
            self.poisoned.discard(tp)


#: The table of the applied offsets of shared source partitions (exactly_once).
APPLIED_TABLE = "batch_offsets"

#: Progress of another reader of a shared topic: for a partition, the offset before
#: which it has handed all its results to the partition's transactional producer, or
#: None when it does not know yet.
Progress = Callable[[Any], "int | None"]


class BatchProcessor:
    """Applies :class:`PartitionBatch` es of the agents that declared it."""

    def __init__(self, app: faust.App) -> None:
        self.app = app
        self.gate = CommitGate()
        #: topic -> the progress of the app's other readers of it (exactly_once)
        self.sharers: defaultdict[str, list[Progress]] = defaultdict(list)
        #: exactly_once, shared topics: source partition -> applied offset, changelogged
        self.applied_table: Any = None
        #: shared partitions whose applied offset has been read from ``applied_table``
        self._loaded: set[Any] = set()
        self._locks: defaultdict[tuple[str, int], asyncio.Lock] = defaultdict(asyncio.Lock)
        #: per partition, the first offset of a hole: events from there are applied only
        #: once that offset is fetched again
        self.rewind: dict[Any, int] = {}
        self._sought: dict[Any, float] = {}
        self.contiguous: set[str] = set()
        #: per partition: the gap, how often it was seen, since when
        self._holes: dict[Any, tuple[tuple[int, int], int, float]] = {}

    def gate_topic(self, topic: Any, contiguous: bool = False) -> None:
        """Commit offsets of ``topic`` only as far as applied batches go. ``contiguous``:
        its records have consecutive offsets (plain producers, no compaction), so a jump
        is a record that was fetched but never delivered."""
        names = topic.topics if hasattr(topic, "topics") else [topic]
        self.gate.topics.update(names)
        if contiguous:
            self.contiguous.update(names)

    def share(self, topic: str, progress: Progress, **table_options: Any) -> None:
        """Another agent of the app reads ``topic`` too. Under exactly_once a batch then
        commits the topic's offset no further than ``progress`` says that agent has
        gone, and keeps its own applied offset in the ``batch_offsets`` table (declared
        here with ``table_options``)."""
        self.sharers[topic].append(progress)
        self.gate.shared.add(topic)
        conf: Any = self.app.conf
        exactly_once = conf.processing_guarantee == ProcessingGuarantee.EXACTLY_ONCE
        if exactly_once and self.applied_table is None:
            self.applied_table = self.app.Table(
                APPLIED_TABLE,
                key_type=bytes,
                value_type=int,
                default=None,
                help="batches: the last applied offset of each shared source partition",
                **table_options,
            )

    async def on_revoked_signal(self, sender: Any, revoked: Iterable[Any], **kwargs: Any) -> None:
        """``app.on_partitions_revoked`` receiver. A hole waiting to be fetched again is
        forgotten too: a later assignment starts from the committed offset. A shared
        partition's applied offset is read again from its table: another worker may
        have applied more meanwhile."""
        revoked = list(revoked)
        self.gate.forget(revoked)
        for tp in revoked:
            self.rewind.pop(tp, None)
            self._holes.pop(tp, None)
            if tp in self._loaded:
                self._loaded.discard(tp)
                self.gate.applied.pop(tp, None)

    def _load_applied(self, tp: Any) -> None:
        """A shared partition's applied offset from ``batch_offsets`` (tables restored)."""
        if tp in self._loaded or self.applied_table is None or tp.topic not in self.sharers:
            return
        stored = read(self.applied_table, tp.partition, partition_key(tp.topic, tp.partition))
        if stored is not None:
            applied = max(
                self.gate.applied.get(tp, 0), int(decode_value(self.applied_table, stored))
            )
            self.gate.applied[tp] = applied
            hole = self.rewind.get(tp)
            if hole is not None and hole < applied:
                # What lies below was applied already: wait for the first offset after it.
                self.rewind[tp] = applied
        self._loaded.add(tp)

    def _shared_bound(self, tp: Any) -> int | None:
        """How far the other readers of a shared partition have gone; None if unknown."""
        bound: int | None = None
        for progress in self.sharers.get(tp.topic, ()):
            done = progress(tp)
            if done is None:
                return None
            bound = done if bound is None else min(bound, done)
        return bound

    def lock(self, table: Any, partition: int) -> asyncio.Lock:
        """Held while a batch reads and writes ``table``'s partition; other writers of the
        table (the corrections agent) take it too, so no write falls in between."""
        return self._locks[(table.name, partition)]

    async def run(
        self,
        events: Iterable[Any],
        build: Callable[[Any, list[Any]], PartitionBatch],
        tables: Iterable[Any] = (),
    ) -> None:
        """Build and apply one batch per source partition of ``events``, partitions in
        parallel (each its own transaction). ``build`` reads the tables it writes under
        their partition locks; with ``tables``, nothing is applied before the worker has
        restored them."""
        tables = list(tables)

        async def one(tp: Any, group: list[Any]) -> None:
            async with contextlib.AsyncExitStack() as stack:
                for table in tables:
                    await stack.enter_async_context(self.lock(table, tp.partition))
                await self.apply(build(tp, group))

        groups = self._pending(events, needs_tables=bool(tables))
        if not groups:
            return
        if len(groups) == 1:
            ((tp, group),) = groups.items()
            await one(tp, group)
            return
        results = await asyncio.gather(
            *(one(tp, group) for tp, group in groups.items()), return_exceptions=True
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result

    def _tables_ready(self) -> bool:
        recovery: Any = getattr(self.app.tables, "recovery", None)
        app: Any = self.app
        return recovery is not None and recovery.completed.is_set() and not app.rebalancing

    def _pending(self, events: Iterable[Any], needs_tables: bool) -> dict[Any, list[Any]]:
        """The events to apply, by partition, in offset order, each once.

        Left out: events of partitions this worker no longer owns (their new owner starts
        from the committed offset); events already applied (fetched again after a seek);
        events after a hole, that is after a record that faust skipped (``_on_ack``) and
        that is being fetched again; with ``needs_tables``, every event while the tables
        are being restored (they are fetched again after the restore).
        """
        self.install_skip_watch(self.app.consumer)
        assignment = self.app.consumer.assignment()
        ready = not needs_tables or self._tables_ready()
        load = self.applied_table is not None
        groups: dict[Any, list[Any]] = {}
        for tp, group in by_partition(events).items():
            for event in group:
                event.message.streamstate_seen = True
            if tp not in assignment:
                logger.info(
                    "%s[%d]: %d events of a revoked partition left to its owner",
                    tp.topic,
                    tp.partition,
                    len(group),
                )
                continue
            shared = load and tp.topic in self.sharers
            if shared and self._tables_ready():
                self._load_applied(tp)
            applied = self.gate.applied.get(tp, 0)
            # A seek back can deliver a record again while its first copy still waits
            # in the batch: one event per offset.
            unique = {e.message.offset: e for e in group if e.message.offset >= applied}
            if not unique:
                continue
            offsets = sorted(unique)
            if not ready or (shared and tp not in self._loaded):
                self._rewind_to(tp, offsets[0], "tables still restoring")
                continue
            hole = self.rewind.get(tp)
            if hole is not None:
                if hole in unique:
                    del self.rewind[tp]  # fetched again: contiguous from here
                else:
                    kept = [offset for offset in offsets if offset < hole]
                    if len(kept) < len(offsets):
                        self._seek_back(tp)
                    offsets = kept
            if offsets and tp.topic in self.contiguous:
                offsets = self._contiguous(tp, offsets, self.gate.applied.get(tp, offsets[0]))
            if offsets:
                groups[tp] = [unique[offset] for offset in offsets]
        return groups

    def _contiguous(self, tp: Any, offsets: list[int], expected: int) -> list[int]:
        """The offsets up to the first one missing (this topic's offsets have no gaps: a
        missing one was fetched but never delivered); the partition is fetched again
        from there. If the same gap keeps coming back (five times over ten seconds),
        the records are not there (a
        transactional producer's markers, say) and every offset goes on."""
        kept = 0
        for offset in offsets:
            if offset != expected:
                break
            kept += 1
            expected += 1
        if kept == len(offsets):
            self._holes.pop(tp, None)
            return offsets
        gap = (expected, offsets[kept])
        now = time.monotonic()
        seen = self._holes.get(tp)
        if seen is not None and seen[0] == gap and seen[1] >= 5 and now - seen[2] >= 10.0:
            # Fetched again five times over ten seconds and still missing: the records
            # are not there. A gap seen again sooner can be records that faust's fetch
            # loop dropped again as already read.
            del self._holes[tp]
            logger.warning(
                "%s[%d]: offsets %d-%d hold no records; going on from %d",
                tp.topic,
                tp.partition,
                gap[0],
                gap[1] - 1,
                gap[1],
            )
            return offsets
        if seen is None or seen[0] != gap:
            self._holes[tp] = (gap, 1, now)
        else:
            self._holes[tp] = (gap, seen[1] + 1, seen[2])
        logger.info(
            "%s[%d]: offsets %d-%d were not delivered; fetching them again",
            tp.topic,
            tp.partition,
            gap[0],
            gap[1] - 1,
        )
        self._seek(tp, expected)
        return offsets[:kept]

    def install_skip_watch(self, consumer: Any) -> None:
        """Watch ``consumer`` for records of the gated topics acked unprocessed."""
        if getattr(consumer, "_streamstate_skip_watch", None) is self:
            return
        original = consumer.ack

        def ack(message: Any) -> bool:
            if message.topic in self.gate.topics and not getattr(
                message, "streamstate_seen", False
            ):
                # A stream acks a record it skipped (flow suspended, stale generation)
                # without it ever reaching the agent.
                tp = message.tp
                if message.offset >= self.gate.applied.get(tp, 0):
                    self._rewind_to(tp, message.offset, "skipped by the stream")
            acked: bool = original(message)
            return acked

        consumer.ack = ack
        consumer._streamstate_skip_watch = self

    def _rewind_to(self, tp: Any, offset: int, why: str) -> None:
        current = self.rewind.get(tp)
        if current is None or offset < current:
            self.rewind[tp] = offset
            logger.info("%s[%d]: fetching again from %d (%s)", tp.topic, tp.partition, offset, why)
        self._seek_back(tp)

    def _seek_back(self, tp: Any) -> None:
        """Seek to the hole (at most once a second per partition): the next fetch of the
        partition starts there."""
        now = time.monotonic()
        offset = self.rewind.get(tp)
        if offset is None or now - self._sought.get(tp, -1e9) < 1.0:
            return
        self._sought[tp] = now
        self._seek(tp, offset)

    def _seek(self, tp: Any, offset: int) -> None:
        async def seek() -> None:
            consumer: Any = self.app.consumer
            if tp in consumer.assignment():
                try:
                    await consumer.seek(tp, offset)
                except Exception as exc:  # a rebalance seeks every partition anyway
                    logger.info(
                        "%s[%d]: seek to %d failed: %r", tp.topic, tp.partition, offset, exc
                    )

        self.app.loop.create_task(seek())

    async def apply(self, batch: PartitionBatch) -> None:
        """Make the batch take effect, or poison its partition and crash the worker."""
        self.gate.own_commits = self.app.in_transaction
        self.gate.install(self.app.consumer)
        tp = batch.tp
        if tp in self.gate.poisoned:
            raise BatchFailed(f"{tp.topic}[{tp.partition}] is poisoned by an earlier failure")
        try:
            if self.app.in_transaction:
                await self._apply_in_transaction(batch)
            else:
                await self._apply_at_least_once(batch)
        except asyncio.CancelledError:
            self.gate.poisoned.add(tp)
            raise
        except Exception as exc:
            self.gate.poisoned.add(tp)
            logger.exception(
                "batch of %s[%d] up to offset %d failed; the worker stops and a restart "
                "resumes from the last applied batch",
                tp.topic,
                tp.partition,
                batch.last_offset,
            )
            await self.app.crash(exc)
            raise BatchFailed(str(exc)) from exc
        self.gate.applied[tp] = batch.last_offset + 1
        logger.debug("applied %s[%d] up to %d", tp.topic, tp.partition, batch.last_offset)

    async def _apply_at_least_once(self, batch: PartitionBatch) -> None:
        partition = batch.tp.partition
        producer: Any = self.app.producer
        for table, items in batch.writes.items():
            _write_local(table, partition, items)
            topic = table.changelog_topic.get_topic_name()
            last = None
            for key, value in items.items():
                last = await producer.send(topic, key, value, partition, None, None)
            if last is not None:
                # Records of one partition are delivered in order: the last one's offset
                # is how far the changelog holds this database (what a restart skips).
                last.add_done_callback(functools.partial(_persisted, table.data))
        for out in batch.outputs:
            await producer.send(
                out.topic,
                out.key,
                out.value,
                out.partition,
                None if out.timestamp_ms is None else out.timestamp_ms / 1000.0,
                out.headers,
            )

    async def _apply_in_transaction(self, batch: PartitionBatch) -> None:
        tp = batch.tp
        app: Any = self.app
        tid = transactional_id(app, tp.topic, tp.partition)
        producer: Any = app.producer
        applied = batch.last_offset + 1
        commit_to: int | None = applied
        if tp.topic in self.sharers and self.applied_table is not None:
            batch.set(
                self.applied_table,
                partition_key(tp.topic, tp.partition),
                encode_value(self.applied_table, applied),
            )
        async with in_transaction(producer, tid) as transaction:
            if tp.topic in self.sharers:
                # Read under the lock: the other readers hand their results to this
                # producer under it, so all they had done by now commits with this batch.
                bound = self._shared_bound(tp)
                commit_to = None if bound is None else min(applied, bound)
                committed = app.consumer._committed_offset.get(tp)
                if commit_to is not None and committed is not None and commit_to <= committed:
                    commit_to = None
            sends = []
            for table, items in batch.writes.items():
                topic = table.changelog_topic.get_topic_name()
                for key, value in items.items():
                    sends.append(
                        await transaction.send(topic, value, key=key, partition=tp.partition)
                    )
            for out in batch.outputs:
                sends.append(await send_output(transaction, out))
            if sends:
                await asyncio.gather(*sends)
            if commit_to is not None:
                await transaction.send_offsets_to_transaction({tp: commit_to}, app.conf.id)
            await transaction.commit_transaction()
            await transaction.begin_transaction()
        if commit_to is not None:
            # faust's own commit need not commit this offset again.
            app.consumer._committed_offset[tp] = commit_to
        for table, items in batch.writes.items():
            _write_local(table, tp.partition, items)


class BatchFailed(RuntimeError):
    """A batch could not be applied; its partition takes no more batches."""


def partition_key(topic: str, partition: int) -> bytes:
    """The key a table keeps a source partition's offset under: ``topic:partition``."""
    return f"{topic}:{partition}".encode()


def _persisted(store: Any, delivered: asyncio.Future[Any]) -> None:
    if not delivered.cancelled() and delivered.exception() is None:
        metadata = delivered.result()
        store.set_persisted_offset(metadata.topic_partition, metadata.offset)


def _write_local(table: Any, partition: int, items: Mapping[bytes, bytes | None]) -> None:
    store: Any = table.data
    db = store._db_for_partition(partition)
    batch = WriteBatch(raw_mode=True)
    for key, value in items.items():
        if value is None:
            batch.delete(key)
        else:
            batch.put(key, value)
        store._key_index[key] = partition
    db.write(batch)
