"""The engine every pipeline runs on: fetched batches in, state, outputs and offsets out.

For each source partition number ``p`` assigned to this worker there is one
:class:`Task`. All source topics are co-partitioned, so task ``p`` reads partition ``p``
of every source topic and owns partition ``p`` of every table. Each batch cycle of a
task takes the records fetched for its partitions, hands each pipeline the records of
its topics (:mod:`tables.pipeline`), and then makes the cycle take effect as one unit
(:meth:`Task.commit`): the changelog records of every table write, the pipelines'
output records and the next source offsets go to Kafka together (one transaction under
``exactly_once``; produce, wait for every acknowledgement, commit under
``at_least_once``), and only then are the writes applied to the local stores, in one
write batch per table partition that also records the changelog offset it reaches and
the task's position.

The :class:`Checkpoint` of a task is its one record of applied offsets: the next offset
of each source partition. It filters records fetched again after a seek, it is what the
task commits, and the same offsets are written into every table partition the task
writes (:data:`POSITION_KEY`), in the changelog too, so a standby knows how far its copy
goes in terms of the source topics.

A record whose processing raises goes to its topic's dead-letter topic with the
exception in its ``error`` header, and the rest of its batch takes effect. A failure of
Kafka (:class:`EngineFailure`) takes nothing: the tasks close and start again from the
committed offsets once Kafka answers. A failure of a store after Kafka took the cycle
(:class:`StoreFailure`) stops the engine for good, with the reason in :attr:`Engine.failure`:
the store is behind its changelog, and a restart restores it. Nothing is skipped.

Nothing here imports faust or aiokafka: the worker plugs in a :class:`Connector`
(``tables/faust_adapter.py``), and tests plug in an in-process one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from core.topics import POSITION_KEY
from tables.pipeline import (
    Batch,
    Output,
    Pipeline,
    SourceRecord,
    StorePartition,
    TableView,
    dead_letter_record,
)
from tables.positions import (
    Lineage,
    Offsets,
    Position,
    decode_offsets,
    encode_offsets,
    merge_into,
)

logger = logging.getLogger(__name__)

#: Called after a cycle's writes reach a table partition's store: (table, partition,
#: the changes, None deleting, :data:`POSITION_KEY` among them).
Listener = Callable[[str, int, Mapping[bytes, bytes | None]], None]


class TP(NamedTuple):
    """A topic partition (equal to aiokafka's and faust's, which are named tuples too)."""

    topic: str
    partition: int


class EngineFailure(RuntimeError):
    """Kafka failed under a cycle: the cycle did not take effect, and the tasks start
    again from the committed offsets once Kafka answers."""


class StoreFailure(EngineFailure):
    """A store failed after Kafka took the cycle: the store is behind its changelog, so
    the engine processes nothing more; a restart restores it from the changelog."""


class TableStore(Protocol):
    """One table's local store on this worker."""

    name: str
    changelog_topic: str

    def partition(self, partition: int) -> StorePartition: ...

    def apply(
        self, partition: int, changes: Mapping[bytes, bytes | None], changelog_offset: int | None
    ) -> None:
        """Write ``changes`` (None deletes) and the changelog offset, atomically."""
        ...

    def position(self, partition: int) -> bytes | None:
        """The encoded :class:`~tables.positions.Position` a partition holds, if any."""
        ...


class Delivery(Protocol):
    """How one task's cycles reach Kafka."""

    async def open(self) -> None:
        """Before the task's first cycle (exactly_once: fences the previous owner)."""

    async def send(
        self, outputs: Sequence[Output], offsets: Mapping[TP, int], state: Sequence[Output] = ()
    ) -> dict[TP, int]:
        """Produce ``outputs`` and the changelog records ``state`` and wait until Kafka
        holds them; under exactly_once commit ``offsets`` in the same transaction. Under
        at_least_once ``state`` goes only once Kafka holds ``outputs``: a crash in between
        sends the outputs again, and never leaves a changelog saying a record was applied
        (a join's dedupe by offset) while its outputs were lost. Returns the last offset
        written per topic partition."""
        ...

    async def close(self) -> None: ...


class Connector(Protocol):
    """What the engine needs of the consumer group and its producers."""

    def ready(self, partition: int) -> bool:
        """Whether this worker actively holds the partition's tables, restored."""
        ...

    def assigned(self, partition: int, topics: frozenset[str]) -> list[TP]:
        """The partitions numbered ``partition`` of ``topics`` assigned to this worker."""
        ...

    def delivery(self, partition: int) -> Delivery: ...

    async def committed(self, tps: Sequence[TP]) -> dict[TP, int | None]:
        """The group's committed offsets (final: the task's delivery is open)."""
        ...

    async def seek(self, offsets: Mapping[TP, int | None]) -> None:
        """Fetch from these offsets next (None: from the beginning)."""
        ...

    async def commit(self, offsets: Mapping[TP, int]) -> None:
        """at_least_once: commit the offsets of acknowledged, applied cycles."""
        ...

    async def prepare(self) -> None:
        """Wait for what every pipeline needs before its first batch (the catalogue)."""
        ...


@dataclass
class Checkpoint:
    """One task's applied offsets: per source partition, the next offset to apply.

    ``None`` for a partition with nothing committed: its first fetched record is new.
    """

    next: dict[TP, int | None] = field(default_factory=dict)

    def pending(self, tp: TP, records: Sequence[SourceRecord]) -> Sequence[SourceRecord]:
        """The records not applied yet (fetched again after a seek, a batch may repeat)."""
        start = self.next.get(tp)
        if start is None or not records or records[0].offset >= start:
            return records
        return [record for record in records if record.offset >= start]

    def after(self, tp: TP, records: Sequence[SourceRecord], position: int | None) -> int:
        """The next offset once ``records`` are applied: past the last record, or past
        the transaction markers that follow it when the consumer's position says so."""
        end = records[-1].offset + 1 if records else (self.next.get(tp) or 0)
        return max(end, position or 0)

    def update(self, offsets: Mapping[TP, int]) -> None:
        self.next.update(offsets)


@dataclass
class Figures:
    """What the engine has done, read by the metrics at scrape time."""

    events: Counter[str] = field(default_factory=Counter)
    dead_letters: Counter[str] = field(default_factory=Counter)
    failed_records: Counter[str] = field(default_factory=Counter)
    #: (pipeline, topic): records a pipeline applied of a topic it reads
    read: Counter[tuple[str, str]] = field(default_factory=Counter)
    #: (pipeline, table): keys a pipeline's batches wrote (changelog records)
    written: Counter[tuple[str, str]] = field(default_factory=Counter)
    #: (pipeline, topic): records a pipeline sent, dead letters included
    sent: Counter[tuple[str, str]] = field(default_factory=Counter)
    cycles: int = 0
    cycle_seconds: float = 0.0


class Task:
    """Partition ``p`` of every source topic and every table, on this worker."""

    def __init__(
        self,
        partition: int,
        pipelines: Sequence[Pipeline],
        tables: Mapping[str, TableStore],
        delivery: Delivery,
        figures: Figures,
        *,
        lineage: Lineage,
        partitions: int,
        listeners: Sequence[Listener] = (),
    ) -> None:
        self.partition = partition
        self.pipelines = pipelines
        self.tables = tables
        self.delivery = delivery
        self.figures = figures
        self.lineage = lineage
        #: partitions of every topic (the repartition topics' position records go to each)
        self.partitions = partitions
        self.listeners = listeners
        self.checkpoint = Checkpoint()
        self.caches: dict[str, Any] = {}
        #: records parsed in the current cycle (Batch.parsed)
        self.parses: dict[Any, Any] = {}
        #: per repartition topic read, the source offsets its applied records carried
        self.upstream: dict[str, Offsets] = {}
        self._ordered = {spec.name for p in pipelines for spec in p.writes if spec.ordered}

    def load_positions(self) -> None:
        """Take the upstream offsets the task's table partitions hold (a new task)."""
        for store in self.tables.values():
            raw = store.position(self.partition)
            if raw is not None:
                for topic, offsets in Position.decode(raw).upstream.items():
                    merge_into(self.upstream.setdefault(topic, {}), offsets)

    # -- one cycle --------------------------------------------------------------------

    async def run(
        self, fetched: Mapping[TP, Sequence[SourceRecord]], positions: Mapping[TP, int]
    ) -> dict[TP, int]:
        """Apply one fetched batch; return the offsets it moved on (what to commit)."""
        pending = {tp: self.checkpoint.pending(tp, rs) for tp, rs in fetched.items()}
        offsets = {
            tp: self.checkpoint.after(tp, records, positions.get(tp))
            for tp, records in pending.items()
        }
        offsets = {tp: o for tp, o in offsets.items() if o != self.checkpoint.next.get(tp)}
        if not offsets:
            return {}
        records = {tp.topic: rs for tp, rs in pending.items() if rs}
        for topic in self.lineage.internal & records.keys():
            records[topic] = self._take_positions(topic, records[topic])
        views = {
            name: TableView(name, store.partition(self.partition), ordered=name in self._ordered)
            for name, store in self.tables.items()
        }
        outputs: list[Output] = []
        fed: set[str] = set()
        self.parses = {}
        for pipeline in self.pipelines:
            mine = {topic: records[topic] for topic in pipeline.reads if topic in records}
            if mine:
                outputs.extend(self._apply(pipeline, mine, views))
                outputs.extend(self._position_records(pipeline, offsets))
                fed.update(spec.name for spec in pipeline.writes)
        await self.commit(views, fed, outputs, offsets)
        return offsets

    def _take_positions(
        self, topic: str, records: Sequence[SourceRecord]
    ) -> Sequence[SourceRecord]:
        """The data records of a repartition topic; its position records are taken in."""
        if not any(record.key == POSITION_KEY for record in records):
            return records
        offsets = self.upstream.setdefault(topic, {})
        for record in records:
            if record.key == POSITION_KEY and record.value is not None:
                merge_into(offsets, decode_offsets(record.value))
        return [record for record in records if record.key != POSITION_KEY]

    def _offset(self, topic: str, moved: Mapping[TP, int]) -> int | None:
        tp = TP(topic, self.partition)
        found = moved.get(tp)
        return found if found is not None else self.checkpoint.next.get(tp)

    def _held(self, topics: frozenset[str], moved: Mapping[TP, int]) -> Offsets:
        """The offsets of ``topics`` (this task's partition) and of the sources upstream
        of the repartition topics among them."""
        held: Offsets = {}
        for topic in topics:
            offset = self._offset(topic, moved)
            if offset is not None:
                merge_into(held, {topic: {self.partition: offset}})
            if topic in self.lineage.internal:
                merge_into(held, self.upstream.get(topic, {}))
        return held

    def _position_records(self, pipeline: Pipeline, moved: Mapping[TP, int]) -> list[Output]:
        """One record per partition of each repartition topic ``pipeline`` sends to, with
        the source offsets its cycle has applied."""
        relays = self.lineage.internal.intersection(pipeline.produces)
        if not relays:
            return []
        reads = frozenset(pipeline.reads)
        carried = {t: o for t, o in self._held(reads, moved).items() if t not in relays}
        value = encode_offsets(carried)
        return [
            Output(topic, POSITION_KEY, value, partition)
            for topic in sorted(relays)
            for partition in range(self.partitions)
        ]

    def _position(self, table: str) -> bytes:
        feeds = self.lineage.feeds.get(table, frozenset())
        upstream = {t: self.upstream[t] for t in feeds if t in self.upstream}
        return Position(self._held(feeds, {}), upstream).encode()

    def _apply(
        self,
        pipeline: Pipeline,
        records: dict[str, Sequence[SourceRecord]],
        views: Mapping[str, TableView],
    ) -> list[Output]:
        """Run the pipeline on the batch; if it raises, record by record, so that only
        the records that raise are left out (sent to their dead-letter topics)."""
        batch = self._batch(pipeline, records, views)
        try:
            pipeline.process(batch)
        except Exception:
            logger.warning(
                "%s[%d]: the batch raised; applying its records one by one",
                pipeline.name,
                self.partition,
                exc_info=True,
            )
            self.caches.pop(pipeline.name, None)
            return self._one_by_one(pipeline, records, views)
        self._keep(batch)
        return batch.outputs

    def _one_by_one(
        self,
        pipeline: Pipeline,
        records: dict[str, Sequence[SourceRecord]],
        views: Mapping[str, TableView],
    ) -> list[Output]:
        outputs: list[Output] = []
        for topic in pipeline.reads:
            for record in records.get(topic, ()):
                batch = self._batch(pipeline, {topic: [record]}, views)
                try:
                    pipeline.process(batch)
                except Exception as exc:
                    self.caches.pop(pipeline.name, None)
                    reason = f"processing failed: {type(exc).__name__}: {exc}"
                    logger.error(
                        "%s: %s[%d]@%d: %s",
                        pipeline.name,
                        record.topic,
                        record.partition,
                        record.offset,
                        reason,
                    )
                    dead = dead_letter_record(record, reason[:1000])
                    outputs.append(dead)
                    self.figures.dead_letters[record.topic] += 1
                    self.figures.sent[(pipeline.name, dead.topic)] += 1
                    self.figures.failed_records[pipeline.name] += 1
                    continue
                self._keep(batch)
                outputs.extend(batch.outputs)
        return outputs

    def _batch(
        self,
        pipeline: Pipeline,
        records: dict[str, Sequence[SourceRecord]],
        views: Mapping[str, TableView],
    ) -> Batch:
        cache = self.caches.get(pipeline.name)
        if cache is None and pipeline.cache is not None:
            cache = self.caches[pipeline.name] = pipeline.cache()
        tables = {spec.name: views[spec.name].child() for spec in pipeline.writes}
        return Batch(pipeline.name, self.partition, records, tables, cache, self.parses)

    def _keep(self, batch: Batch) -> None:
        figures, pipeline = self.figures, batch.pipeline
        for name, view in batch.tables.items():
            figures.written[(pipeline, name)] += len(view)
            view.merge_into_parent()
        for topic, records in batch.records.items():
            figures.read[(pipeline, topic)] += len(records)
        figures.events[pipeline] += sum(len(rs) for rs in batch.records.values())
        figures.sent.update((pipeline, output.topic) for output in batch.outputs)
        for topic, n in batch.dead_lettered.items():
            self.figures.dead_letters[topic] += n

    # -- taking effect ----------------------------------------------------------------

    async def commit(
        self,
        views: Mapping[str, TableView],
        fed: set[str],
        outputs: list[Output],
        offsets: Mapping[TP, int],
    ) -> None:
        """Make one cycle take effect: Kafka first (changelogs, outputs, offsets as one
        unit), then the local stores, then the checkpoint."""
        self.checkpoint.update(offsets)
        changes: dict[str, dict[bytes, bytes | None]] = {}
        for name, view in views.items():
            if len(view) or name in fed:
                table_changes = view.changes()
                table_changes[POSITION_KEY] = self._position(name)
                changes[name] = table_changes
        records: list[Output] = []
        for name, items in changes.items():
            topic, partition = self.tables[name].changelog_topic, self.partition
            records += [Output(topic, key, value, partition) for key, value in items.items()]
        try:
            written = await self.delivery.send(outputs, offsets, state=records)
        except Exception as exc:
            raise EngineFailure(
                f"task {self.partition}: Kafka did not take the batch: {exc!r}"
            ) from exc
        try:
            for name, items in changes.items():
                store = self.tables[name]
                offset = written.get(TP(store.changelog_topic, self.partition))
                store.apply(self.partition, items, offset)
        except Exception as exc:
            raise StoreFailure(f"task {self.partition}: the store failed: {exc!r}") from exc
        for name, items in changes.items():
            for listener in self.listeners:
                try:
                    listener(name, self.partition, items)
                except Exception:  # a listener must not stop the engine
                    logger.exception("a listener failed on %s[%d]", name, self.partition)


class Engine:
    """The tasks of one worker and the batch cycles that feed them."""

    def __init__(
        self,
        pipelines: Sequence[Pipeline],
        tables: Mapping[str, TableStore],
        connector: Connector,
        *,
        exactly_once: bool,
        partitions: int,
    ) -> None:
        self.pipelines = list(pipelines)
        self.tables = dict(tables)
        self.connector = connector
        self.exactly_once = exactly_once
        self.partitions = partitions
        self.lineage = Lineage.of(self.pipelines)
        #: called after each cycle's writes reach a table partition (the query layer's
        #: waits and change streams)
        self.listeners: list[Listener] = []
        self.topics = frozenset(topic for p in pipelines for topic in p.reads)
        written = {spec.name for p in pipelines for spec in p.writes}
        if missing := written - set(tables):
            raise ValueError(f"pipelines write undeclared tables: {sorted(missing)}")
        self.tasks: dict[int, Task] = {}
        self.figures = Figures()
        #: why the engine stopped for good (a store failed), or None
        self.failure: str | None = None
        self._lock = asyncio.Lock()

    def fail(self, reason: str) -> None:
        """Stop processing for good: a store failed (the first reason is kept)."""
        if self.failure is not None:
            return
        self.failure = reason
        logger.error(
            "%s; the worker processes nothing more (it answers reads and reports the "
            "failure on /ready and /metrics); a restart restores the store from its "
            "changelog and resumes from the committed offsets",
            reason,
        )

    async def offer(
        self,
        fetched: Mapping[Any, Sequence[SourceRecord]],
        positions: Mapping[Any, int],
        *,
        settled: bool = True,
    ) -> None:
        """Hand one fetch to the engine. What it does not apply is fetched again: the
        consumer's position is past it, and a partition that receives nothing more would
        never start its task to seek back.

        ``settled`` is False when the group is rebalancing or the fetch belongs to an
        earlier generation: the tasks close, and start again from the committed offsets
        once the records come back. A Kafka failure under the cycle does the same before
        it is raised; a store failure is raised as it is (nothing more is processed)."""
        if not settled:
            await self.revoke()
            await self.refetch(fetched)
            return
        try:
            await self.process(fetched, positions)
        except StoreFailure:
            raise
        except EngineFailure:
            await self.revoke()
            await self.refetch(fetched)
            raise

    async def refetch(self, fetched: Mapping[Any, Sequence[SourceRecord]]) -> None:
        """Seek each fetched source partition back to its first fetched record."""
        again = {
            TP(tp.topic, tp.partition): records[0].offset
            for tp, records in fetched.items()
            if records and tp.topic in self.topics
        }
        if again:
            await self.connector.seek(again)

    async def process(
        self, fetched: Mapping[Any, Sequence[SourceRecord]], positions: Mapping[Any, int]
    ) -> None:
        """One batch cycle over everything fetched; tasks in parallel.

        ``positions``: the consumer's position of each assigned source partition right
        after the fetch (past the transaction markers it skipped)."""
        async with self._lock:
            started = time.monotonic()
            by_partition: dict[int, dict[TP, Sequence[SourceRecord]]] = {}
            for raw_tp, batch in fetched.items():
                tp = TP(raw_tp.topic, raw_tp.partition)
                if tp.topic in self.topics and batch:
                    by_partition.setdefault(tp.partition, {})[tp] = batch
            moved = {TP(tp.topic, tp.partition): offset for tp, offset in positions.items()}
            for tp, offset in moved.items():
                task = self.tasks.get(tp.partition)
                if task is None or tp.partition in by_partition or tp.topic not in self.topics:
                    continue
                known = task.checkpoint.next.get(tp)
                if known is not None and offset > known:
                    # Only transaction markers lay between: commit past them, so that a
                    # caught-up partition shows no lag.
                    by_partition.setdefault(tp.partition, {})[tp] = ()
            runs = []
            for partition, fetched_here in sorted(by_partition.items()):
                task = self.tasks.get(partition)
                if task is None:
                    await self._start(partition, fetched_here)
                    continue
                runs.append((task, fetched_here))
            if not runs:
                return
            results = await asyncio.gather(
                *(task.run(fetched_here, moved) for task, fetched_here in runs),
                return_exceptions=True,
            )
            errors = [r for r in results if isinstance(r, BaseException)]
            if errors:
                raise errors[0]
            committed: dict[TP, int] = {}
            for result in results:
                assert isinstance(result, dict)
                committed.update(result)
            if committed and not self.exactly_once:
                try:
                    await self.connector.commit(committed)
                except Exception as exc:
                    raise EngineFailure(f"the offsets were not committed: {exc!r}") from exc
            self.figures.cycles += 1
            self.figures.cycle_seconds += time.monotonic() - started

    async def _start(self, partition: int, fetched: Mapping[TP, Sequence[SourceRecord]]) -> None:
        """Set up the task of a partition this worker now holds; what was fetched for it
        is dropped and fetched again from the committed offsets."""
        if not self.connector.ready(partition):
            # Not restored here yet (or the group is rebalancing): fetch these records
            # again. Dropped, they would wait for the partition's next record to start
            # its task, and a partition that receives nothing more would never apply them.
            await self.refetch(fetched)
            return
        await self.connector.prepare()
        delivery = self.connector.delivery(partition)
        try:
            await delivery.open()
        except Exception as exc:
            raise EngineFailure(f"task {partition}: its producer did not start: {exc!r}") from exc
        tps = sorted(set(self.connector.assigned(partition, self.topics)) | set(fetched))
        try:
            committed = await self.connector.committed(tps)
            await self.connector.seek(committed)
        except Exception as exc:
            await delivery.close()
            raise EngineFailure(f"task {partition}: no committed offsets: {exc!r}") from exc
        task = Task(
            partition,
            self.pipelines,
            self.tables,
            delivery,
            self.figures,
            lineage=self.lineage,
            partitions=self.partitions,
            listeners=self.listeners,
        )
        task.load_positions()
        task.checkpoint.update({tp: o for tp, o in committed.items() if o is not None})
        for tp, offset in committed.items():
            task.checkpoint.next.setdefault(tp, offset)
        self.tasks[partition] = task
        logger.info(
            "task %d started at %s",
            partition,
            ", ".join(f"{tp.topic}={o}" for tp, o in sorted(committed.items())),
        )

    async def revoke(self) -> None:
        """The group is rebalancing: finish the cycle in flight, then close every task
        (a rebalance revokes all partitions; the tasks start again afterwards)."""
        async with self._lock:
            tasks, self.tasks = self.tasks, {}
            await asyncio.gather(*(task.delivery.close() for task in tasks.values()))
            if tasks:
                logger.info("tasks %s closed", sorted(tasks))

    def lag(self, highwaters: Mapping[Any, int]) -> dict[TP, int]:
        """Records between each source partition's end and its task's checkpoint."""
        lag = {}
        for task in self.tasks.values():
            for tp, offset in task.checkpoint.next.items():
                end = highwaters.get(tp)
                if end is not None:
                    lag[tp] = max(0, end - (offset or 0))
        return lag
