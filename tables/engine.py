"""The engine every pipeline runs on, and the one owner of its commit cycle.

For each source partition number ``p`` assigned to this worker there is one
:class:`Task`. All source topics are co-partitioned, so task ``p`` reads partition ``p``
of every source topic and owns partition ``p`` of every table. A task builds what one
cycle makes (its pipelines over the fetched records, on views of the tables); the
:class:`Engine` makes it take effect, and every rule of the cycle is here, in
:meth:`Engine.process` and the methods it calls, in this order:

1. **Apply.** The records not applied yet (:class:`Checkpoint`) go to the pipelines
   (:mod:`tables.pipeline`), whose writes stay on table views; a record whose processing
   raises is dead-lettered. Every output and changelog record is checked against its
   topic's rules; the input records whose effects would be refused are dead-lettered
   and the rest is built again without them (:mod:`tables.refusals`).
2. **Produce and wait.** The changelog records of every table write (each table
   partition's position among them), the outputs (position records for the repartition
   topics among them) and, under ``exactly_once``, the next source offsets go to Kafka
   as one transaction of the task's own producer (:meth:`Engine._produce`). Under
   ``at_least_once`` the outputs are acknowledged before any changelog record is sent.
3. **Store.** Only then are the writes applied to the local stores, one write batch per
   table partition with the changelog offset it reaches and the partition's position;
   then the listeners (the query layer's waits and change streams) hear of them.
4. **Commit.** Under ``at_least_once`` the consumer group commits the offsets of every
   task whose cycle got this far, once per engine cycle (:meth:`Engine._commit`); a
   commit the group refuses because it rebalanced is not a failure: the partitions'
   next owners apply those records again.

When it fails:

* Kafka refuses records for their own sake (too large, a timestamp out of range, no key
  for a compacted topic): the task learns which input records made them, its producer is
  replaced, and it tries again at once, up to :data:`MAX_ROUNDS` attempts
  (:meth:`Engine._run`). Under ``at_least_once`` the outputs Kafka took from a failed
  attempt are not sent again.
* Kafka fails the cycle for another reason (:class:`EngineFailure`): nothing of it takes
  effect; its task closes, its partitions pause and it is tried again from the committed
  offsets after a backoff (:meth:`Engine._stall`: 1 s, doubling up to
  :data:`BACKOFF_CAP_S`; after :data:`ISOLATE_AFTER` failed attempts the records of the
  partitions Kafka failed go one per record batch, so that a record Kafka keeps
  refusing is found and dead-lettered); the other tasks go on.
* The group's commit fails, or the kept tasks' offsets cannot be read: every task
  closes, what was fetched is fetched again, and the tasks start again from the
  committed offsets :data:`KAFKA_RETRY_S` later (:meth:`Engine.offer`).
* A store fails after Kafka took the cycle (:class:`StoreFailure`): the engine processes
  nothing more, with the reason in :attr:`Engine.failure`; the store is behind its
  changelog, and a restart restores it.
* The worker stops: the cycle in flight gets :data:`STOP_WAIT_S` to take effect and is
  then cut short, as a kill -9 would.

Nothing is skipped. The :class:`Checkpoint` of a task is its one record of applied
offsets: it filters records fetched again after a seek, it is what the task commits, and
the same offsets are written into every table partition the task writes
(:data:`POSITION_KEY`), in the changelog too, so a standby knows how far its copy goes
in terms of the source topics.

Timestamps: an output record that its batch function does not time gets the time of
the input records it came from (the largest of its batch's), or the worker's clock when
its topic would refuse that time; changelog records get the worker's clock
(:func:`tables.limits.stamp`, docs/architecture.md).

Nothing here imports faust or aiokafka: the worker plugs in a :class:`Connector` and its
:class:`Producer` parts (``tables/faust_adapter.py``, ``tables/producers.py``), and
tests plug in in-process ones.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from core.topics import POSITION_KEY, dlq_topic
from tables.limits import MAX_REQUEST_BYTES, TopicLimits, refusal, stamp
from tables.pipeline import (
    ERROR_HEADER,
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
from tables.refusals import (
    Plan,
    Produced,
    Provenance,
    Refused,
    SendPlan,
    Undelivered,
    error_name,
    fit_dead_letter,
    learn_failure,
    learn_refusals,
    record_id,
    undelivered_in,
)
from tables.stalls import Stall, slow_report

logger = logging.getLogger(__name__)

#: Called after a cycle's writes reach a table partition's store: (table, partition,
#: the changes, None deleting, and the encoded position the partition now holds). The
#: changes hold the position under :data:`POSITION_KEY` too, which no UTF-8 key equals.
Listener = Callable[[str, int, Mapping[bytes, bytes | None], bytes | None], None]

#: Attempts at one cycle within one engine cycle, when refusals teach the task something
#: (the checks find culprits, Kafka refuses records, a producer is replaced).
MAX_ROUNDS = 6
#: Passes over one cycle's records while the checks before sending find more to refuse.
MAX_PASSES = 6
#: Records per batch at most when a pipeline's effects are checked batch by batch.
CHECKED_BATCH = 64
#: A task whose cycle failed tries again after BACKOFF_BASE_S, then twice as long after
#: each further failed attempt, up to BACKOFF_CAP_S.
BACKOFF_BASE_S = 1.0
BACKOFF_CAP_S = 30.0
#: Failed attempts of one cycle before the records of the partitions Kafka failed go one
#: per record batch (a record Kafka keeps refusing while it takes others is the record's
#: problem: its input is dead-lettered).
ISOLATE_AFTER = 3
#: A cycle in flight this long shows as stalled too (waiting on Kafka, or applying a
#: large fetch in checked batches).
SLOW_CYCLE_S = 10.0
#: After the group's offsets could not be committed, the tasks start again this many
#: seconds later (a task whose own cycle fails backs off by itself).
KAFKA_RETRY_S = 1.0
#: At a stop, how long the cycle in flight may take to take effect before it is cut short.
STOP_WAIT_S = 5.0


class TP(NamedTuple):
    """A topic partition (equal to aiokafka's and faust's, which are named tuples too)."""

    topic: str
    partition: int


class EngineFailure(RuntimeError):
    """Kafka failed under a cycle: the cycle did not take effect, and its task starts
    again from the committed offsets once Kafka answers."""


class CycleFailed(EngineFailure):
    """Kafka did not take some record batches of a task's cycle."""

    def __init__(self, partition: int, undelivered: Undelivered) -> None:
        super().__init__(f"task {partition}: Kafka did not take the batch: {undelivered}")
        self.undelivered = undelivered


class StoreFailure(EngineFailure):
    """A store failed after Kafka took the cycle: the store is behind its changelog, so
    the engine processes nothing more; a restart restores it from the changelog."""


class CommitRefused(Exception):
    """The consumer group refused a commit because it rebalanced meanwhile."""


class TableStore(Protocol):
    """One table's local store on this worker."""

    name: str

    @property
    def changelog_topic(self) -> str: ...

    def partition(self, partition: int) -> StorePartition: ...

    def apply(
        self, partition: int, changes: Mapping[bytes, bytes | None], changelog_offset: int | None
    ) -> None:
        """Write ``changes`` (None deletes) and the changelog offset, atomically."""
        ...

    def position(self, partition: int) -> bytes | None:
        """The encoded :class:`~tables.positions.Position` a partition holds, if any."""
        ...


class ServedStore(TableStore, Protocol):
    """A table store the query layer reads too, through :meth:`partition` and
    :meth:`position`, as the engine does."""

    def persisted_offset(self, partition: int) -> int | None:
        """The last changelog offset the partition holds (None: none yet)."""
        ...


class Producer(Protocol):
    """A task's producer: the Kafka calls the engine puts in order (:meth:`Engine._produce`).

    Under exactly_once a transactional producer of the task's own; under at_least_once
    the task's view of the worker's idempotent producer (no transactions)."""

    async def open(self) -> None:
        """Before the task's first cycle (a transactional one fences the previous owner
        and aborts what it left open)."""

    async def send(self, records: Sequence[Output], plan: SendPlan) -> dict[TP, int]:
        """Produce ``records`` as record batches of one partition each and wait until
        Kafka holds them all; the last offset written per partition. Raises
        :class:`~tables.refusals.Undelivered` naming the batches Kafka did not take and
        those it took."""
        ...

    def transaction(self) -> AbstractAsyncContextManager[Any]:
        """exactly_once: a transaction, committed when the block ends and aborted when
        it raises."""
        ...

    async def send_offsets(self, offsets: Mapping[TP, int]) -> None:
        """exactly_once: the consumer group's next offsets, in the open transaction."""

    async def reset(self) -> None:
        """After a send failed: the producer cannot send to the failed partitions again
        (its sequence numbers went on past the refused batch); replace it."""

    async def close(self) -> None: ...


class Connector(Protocol):
    """The consumer group's calls and the producers that the engine needs."""

    def ready(self, partition: int) -> bool:
        """Whether this worker actively holds the partition's tables, restored."""
        ...

    def assigned(self, partition: int, topics: frozenset[str]) -> list[TP]:
        """The partitions numbered ``partition`` of ``topics`` assigned to this worker."""
        ...

    def producer(self, partition: int, *, transactional: bool) -> Producer:
        """Task ``partition``'s producer: a transactional one of its own, or a view of
        the worker's idempotent one."""
        ...

    async def committed(self, tps: Sequence[TP]) -> dict[TP, int | None]:
        """The group's committed offsets (final once the task's producer is open)."""
        ...

    async def seek(self, offsets: Mapping[TP, int | None]) -> None:
        """Fetch from these offsets next (None: from the beginning)."""
        ...

    async def commit(self, offsets: Mapping[TP, int]) -> None:
        """Commit the consumer group's offsets; :class:`CommitRefused` when the group
        rebalanced meanwhile."""
        ...

    async def prepare(self) -> None:
        """Wait for what every pipeline needs before its first batch (the catalogue)."""
        ...

    def pause(self, tps: Sequence[TP]) -> None:
        """Fetch nothing more of these partitions until :meth:`resume`."""
        ...

    def resume(self, tps: Sequence[TP]) -> None: ...

    async def limits(self, topics: Sequence[str]) -> dict[str, TopicLimits]:
        """The rules Kafka applies to records produced to ``topics`` (those it knows)."""
        ...

    async def close(self) -> None:
        """At the worker's stop, once every task is closed (the shared producer)."""


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
    #: records through each named step of the pipelines (Batch.counts)
    steps: Counter[str] = field(default_factory=Counter)
    dead_letters: Counter[str] = field(default_factory=Counter)
    failed_records: Counter[str] = field(default_factory=Counter)
    #: input records sent to a dead-letter topic because Kafka refused (or would refuse)
    #: their effects, by (source topic, Kafka's error)
    refused_records: Counter[tuple[str, str]] = field(default_factory=Counter)
    #: attempts at a cycle after a failed one, by cause (refusal: in the same engine
    #: cycle; backoff: after a pause)
    retries: Counter[str] = field(default_factory=Counter)
    #: (pipeline, topic): records a pipeline applied of a topic it reads
    read: Counter[tuple[str, str]] = field(default_factory=Counter)
    #: (pipeline, table): keys a pipeline's batches wrote (changelog records)
    written: Counter[tuple[str, str]] = field(default_factory=Counter)
    #: (pipeline, topic): records a pipeline sent, dead letters included
    sent: Counter[tuple[str, str]] = field(default_factory=Counter)
    cycles: int = 0
    cycle_seconds: float = 0.0


@dataclass
class Limits:
    """The rules of every topic the engine sends to, as the broker last described them."""

    topics: dict[str, TopicLimits] = field(default_factory=dict)
    default: TopicLimits = field(default_factory=TopicLimits)
    read: bool = False

    def of(self, topic: str) -> TopicLimits:
        return self.topics.get(topic, self.default)

    def max_bytes(self, topic: str) -> int:
        """The largest record batch ``topic`` takes from the engine's producers."""
        return min(self.of(topic).max_message_bytes, MAX_REQUEST_BYTES)


@dataclass
class _Work:
    """What the passes over one cycle's records collect."""

    produced: list[Produced] = field(default_factory=list)
    provenance: Provenance = field(default_factory=Provenance)
    events: Counter[str] = field(default_factory=Counter)
    dead_letters: Counter[str] = field(default_factory=Counter)
    failed: Counter[str] = field(default_factory=Counter)
    refused: Counter[tuple[str, str]] = field(default_factory=Counter)
    steps: Counter[str] = field(default_factory=Counter)
    read: Counter[tuple[str, str]] = field(default_factory=Counter)
    written: Counter[tuple[str, str]] = field(default_factory=Counter)
    sent: Counter[tuple[str, str]] = field(default_factory=Counter)


@dataclass
class Cycle:
    """One cycle ready to take effect: what goes to Kafka and to the stores."""

    outputs: list[Output]
    state: list[Output]
    changes: dict[str, dict[bytes, bytes | None]]
    refusals: list[Refused]
    work: _Work


def backoff(attempts: int) -> float:
    """Seconds before attempt ``attempts + 1``, after ``attempts`` failed ones."""
    return float(min(BACKOFF_BASE_S * 2 ** max(attempts - 1, 0), BACKOFF_CAP_S))


def _identity(out: Output) -> tuple[Any, ...]:
    """What makes two outputs the same record for Kafka's readers (not the timestamp)."""
    return (out.topic, out.partition, out.key, out.value, tuple(out.headers or ()))


class Task:
    """Partition ``p`` of every source topic and every table, on this worker."""

    def __init__(
        self,
        partition: int,
        pipelines: Sequence[Pipeline],
        tables: Mapping[str, TableStore],
        producer: Producer,
        figures: Figures,
        *,
        lineage: Lineage,
        partitions: int,
        limits: Limits | None = None,
    ) -> None:
        self.partition = partition
        self.pipelines = pipelines
        self.tables = tables
        self.producer = producer
        self.figures = figures
        self.lineage = lineage
        #: partitions of every topic (the repartition topics' position records go to each)
        self.partitions = partitions
        self.limits = limits if limits is not None else Limits()
        self.checkpoint = Checkpoint()
        self.caches: dict[str, Any] = {}
        #: records parsed in the current cycle (Batch.parsed)
        self.parses: dict[Any, Any] = {}
        #: per repartition topic read, the source offsets its applied records carried
        self.upstream: dict[str, Offsets] = {}
        #: what refusals taught the task about its current cycle
        self.plan = Plan()
        #: where the records of the last cycle sent came from
        self.provenance = Provenance()
        #: outputs of the current cycle that Kafka holds from a failed attempt
        #: (at_least_once): the next attempt does not send them again
        self.landed: Counter[tuple[Any, ...]] = Counter()
        #: when the cycle in flight started (None: none in flight), its first offsets, and
        #: whether it is applying its records or waiting for Kafka to take them
        self.busy_since: float | None = None
        self.busy_at: dict[TP, int | None] = {}
        self.waiting = False
        self._ordered = {spec.name for p in pipelines for spec in p.writes if spec.ordered}
        self._dead_letter_topics = frozenset(dlq_topic(t) for p in pipelines for t in p.reads)
        #: a pass changed the pipelines' caches and its cycle did not take effect
        self._dirty = False

    def load_positions(self) -> None:
        """Take the upstream offsets the task's table partitions hold (a new task)."""
        for store in self.tables.values():
            raw = store.position(self.partition)
            if raw is not None:
                for topic, offsets in Position.decode(raw).upstream.items():
                    merge_into(self.upstream.setdefault(topic, {}), offsets)

    # -- one cycle --------------------------------------------------------------------

    def begin(
        self, fetched: Mapping[TP, Sequence[SourceRecord]], positions: Mapping[TP, int]
    ) -> tuple[dict[str, Sequence[SourceRecord]], dict[TP, int]] | None:
        """Begin a cycle over a fetched batch: the records not applied yet, by topic (a
        repartition topic's position records taken in), and the offsets the cycle moves
        on to; None when it moves nothing on."""
        pending = {tp: self.checkpoint.pending(tp, rs) for tp, rs in fetched.items()}
        offsets = {
            tp: self.checkpoint.after(tp, records, positions.get(tp))
            for tp, records in pending.items()
        }
        offsets = {tp: o for tp, o in offsets.items() if o != self.checkpoint.next.get(tp)}
        if not offsets:
            return None
        records = {tp.topic: rs for tp, rs in pending.items() if rs}
        for topic in self.lineage.internal & records.keys():
            records[topic] = self._take_positions(topic, records[topic])
        self.busy_since = time.monotonic()
        self.busy_at = dict(self.checkpoint.next)
        self.busy_at.update({tp: rs[0].offset for tp, rs in pending.items() if rs})
        return records, offsets

    def sending(self, cycle: Cycle) -> SendPlan:
        """The cycle goes to Kafka: how to send it (where it came from is kept, to learn
        from a refusal)."""
        self.provenance = cycle.work.provenance
        return SendPlan(frozenset(self.plan.isolate), self.limits.max_bytes)

    def kept(self, outputs: Iterable[Output]) -> None:
        """Outputs of the cycle that Kafka holds from a failed attempt (at_least_once):
        the next attempt does not send them again."""
        made = self.provenance.made
        self.landed.update(_identity(out) for out in outputs if id(out) in made)

    def took(self, cycle: Cycle, offsets: Mapping[TP, int]) -> None:
        """Kafka holds the cycle: the checkpoint moves on, and the figures count it."""
        self._dirty = False
        self.checkpoint.update(offsets)
        self._count(cycle.work)

    def end(self, offsets: Mapping[TP, int]) -> None:
        """The cycle took effect: what the next one starts from."""
        self.plan = self.plan.after(offsets)
        self.landed.clear()

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

    def _position_records(self, pipeline: Pipeline, moved: Mapping[TP, int]) -> list[Produced]:
        """One record per partition of each repartition topic ``pipeline`` sends to, with
        the source offsets its cycle has applied."""
        relays = self.lineage.internal.intersection(pipeline.produces)
        if not relays:
            return []
        reads = frozenset(pipeline.reads)
        carried = {t: o for t, o in self._held(reads, moved).items() if t not in relays}
        value = encode_offsets(carried)
        return [
            Produced(Output(topic, POSITION_KEY, value, partition), -1, None, None)
            for topic in sorted(relays)
            for partition in range(self.partitions)
        ]

    def _position(self, table: str, moved: Mapping[TP, int]) -> bytes:
        feeds = self.lineage.feeds.get(table, frozenset())
        upstream = {t: self.upstream[t] for t in feeds if t in self.upstream}
        return Position(self._held(feeds, moved), upstream).encode()

    # -- building a cycle ---------------------------------------------------------------

    def build(self, records: dict[str, Sequence[SourceRecord]], offsets: Mapping[TP, int]) -> Cycle:
        """The cycle's records, checked against their topics' rules: while the checks
        refuse some, the pipelines that made them run again in checked batches, so that
        only the input records whose effects are refused are left out."""
        for _ in range(MAX_PASSES):
            cycle = self._pass(records, offsets)
            if not cycle.refusals:
                return cycle
            if not learn_refusals(self.plan, cycle.refusals, cycle.work.provenance):
                break
        raise EngineFailure(
            f"task {self.partition}: a record the engine writes itself would be refused: "
            f"{cycle.refusals[0].reason}"
        )

    def _pass(self, records: dict[str, Sequence[SourceRecord]], offsets: Mapping[TP, int]) -> Cycle:
        now_ms = int(time.time() * 1000)
        while True:
            if self._dirty:  # an earlier pass changed them: they must match the stores
                self.caches.clear()
            self._dirty = True
            views = {
                name: TableView(
                    name, store.partition(self.partition), ordered=name in self._ordered
                )
                for name, store in self.tables.items()
            }
            self.parses = {}
            work, fed = _Work(), set[str]()
            if self._pipelines(records, offsets, views, work, fed, now_ms):
                return self._finish(records, views, fed, work, offsets, now_ms)

    def _pipelines(
        self,
        records: dict[str, Sequence[SourceRecord]],
        offsets: Mapping[TP, int],
        views: Mapping[str, TableView],
        work: _Work,
        fed: set[str],
        now_ms: int,
    ) -> bool:
        """Every pipeline over its records; False when a record applied by an earlier
        pipeline turned out to be a culprit (the pass starts again without it)."""
        applied: set[str] = set()  # topics earlier pipelines applied records of
        for pipeline in self.pipelines:
            present = [topic for topic in pipeline.reads if topic in records]
            if not present:
                continue
            fed.update(spec.name for spec in pipeline.writes)
            mine = {t: self.plan.admitted(records[t]) for t in present}
            mine = {t: rs for t, rs in mine.items() if rs}
            if mine and pipeline.name in self.plan.suspects:
                found = self._checked(pipeline, mine, views, work, now_ms)
                if any(record.topic in applied for record in found):
                    return False
            elif mine:
                self._apply(pipeline, mine, views, work)
            applied.update(mine)
            work.produced.extend(self._position_records(pipeline, offsets))
        return True

    def _apply(
        self,
        pipeline: Pipeline,
        records: dict[str, Sequence[SourceRecord]],
        views: Mapping[str, TableView],
        work: _Work,
    ) -> None:
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
            self._one_by_one(pipeline, records, views, work)
            return
        at_ms = max((r.timestamp for rs in records.values() for r in rs), default=-1)
        self._keep(batch, work, None)
        work.produced.extend(Produced(out, at_ms, pipeline.name, None) for out in batch.outputs)

    def _one_by_one(
        self,
        pipeline: Pipeline,
        records: dict[str, Sequence[SourceRecord]],
        views: Mapping[str, TableView],
        work: _Work,
    ) -> None:
        for topic in pipeline.reads:
            for record in records.get(topic, ()):
                batch = self._batch(pipeline, {topic: [record]}, views)
                if self._process_one(pipeline, batch, record, work):
                    self._keep_one(pipeline, batch, record, work)

    def _checked(
        self,
        pipeline: Pipeline,
        records: dict[str, Sequence[SourceRecord]],
        views: Mapping[str, TableView],
        work: _Work,
        now_ms: int,
    ) -> list[SourceRecord]:
        """The pipeline in small batches whose effects are checked against their topics'
        rules: a batch whose effects would be refused is applied again in smaller ones,
        down to single records; a record whose own effects would be refused is a culprit,
        and none of them is kept. Batches grow again while they pass (most records pass,
        and a batch function applied record by record can cost far more than once per
        record: a join scans its index every batch); a pipeline marked ``fine`` goes one
        record at a time. Returns the new culprits."""
        found: list[SourceRecord] = []
        size = 1 if pipeline.name in self.plan.fine else CHECKED_BATCH
        for topic in pipeline.reads:
            pending = records.get(topic, ())
            at = 0
            while at < len(pending):
                chunk = pending[at : at + size]
                batch = self._batch(pipeline, {topic: chunk}, views)
                if len(chunk) == 1:
                    if not self._process_one(pipeline, batch, chunk[0], work):
                        at += 1
                        continue
                elif not self._processed(pipeline, batch):
                    size = 1  # one of them raises: find it
                    continue
                why = self._record_refusal(batch, now_ms)
                if why is None:
                    self._keep_chunk(pipeline, batch, chunk, work)
                    at += len(chunk)
                    if pipeline.name not in self.plan.fine:
                        size = min(size * 2, CHECKED_BATCH)
                    continue
                self.caches.pop(pipeline.name, None)  # it may hold the dropped effects
                if len(chunk) > 1:
                    size = max(1, len(chunk) // 4)
                    continue
                self.plan.blame(chunk[0], why)
                found.append(chunk[0])
                at += 1
        if found:  # one line per pass, not per record: a value at its limit refuses many
            first = found[0]
            logger.warning(
                "%s: %d records go to their dead-letter topics, %s[%d]@%d first: %s",
                pipeline.name,
                len(found),
                first.topic,
                first.partition,
                first.offset,
                self.plan.culprits[record_id(first)][1],
            )
        return found

    def _processed(self, pipeline: Pipeline, batch: Batch) -> bool:
        """Run the pipeline on a batch; False when it raises (its effects are dropped)."""
        try:
            pipeline.process(batch)
        except Exception:
            self.caches.pop(pipeline.name, None)
            return False
        return True

    def _keep_chunk(
        self, pipeline: Pipeline, batch: Batch, chunk: Sequence[SourceRecord], work: _Work
    ) -> None:
        if len(chunk) == 1:
            self._keep_one(pipeline, batch, chunk[0], work)
            return
        at_ms = max(record.timestamp for record in chunk)
        self._keep(batch, work, None)
        work.produced.extend(Produced(out, at_ms, pipeline.name, None) for out in batch.outputs)

    def _process_one(
        self, pipeline: Pipeline, batch: Batch, record: SourceRecord, work: _Work
    ) -> bool:
        """Run the pipeline on a batch of one record; False (and a dead letter) when it
        raises."""
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
            letter = dead_letter_record(record, reason[:1000])
            work.produced.append(Produced(letter, record.timestamp, pipeline.name, record))
            work.sent[(pipeline.name, letter.topic)] += 1
            work.dead_letters[record.topic] += 1
            work.failed[pipeline.name] += 1
            return False
        return True

    def _record_refusal(self, batch: Batch, now_ms: int) -> str | None:
        """Why Kafka would refuse one record's effects: its outputs, and its writes to the
        keys whose changelog records were refused (None: it would take them)."""
        for out in batch.outputs:
            if self._is_dead_letter(out):
                continue
            topic = out.topic
            why = refusal(
                topic,
                out.key,
                out.value,
                out.headers,
                out.timestamp_ms,
                self.limits.of(topic),
                now_ms,
                self.limits.max_bytes(topic),
            )
            if why is not None:
                return why
        for name, view in batch.tables.items():
            watched = self.plan.watch.get(name)
            if not watched:
                continue
            topic = self.tables[name].changelog_topic
            for key, raw in view.encoded(watched):
                why = refusal(
                    topic,
                    key,
                    raw,
                    None,
                    None,
                    self.limits.of(topic),
                    now_ms,
                    self.limits.max_bytes(topic),
                )
                if why is not None:
                    return f"{why} (table {name}, key {key!r})"
        return None

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
        for name in pipeline.lookups:
            # Read as the cycle found it: what other pipelines write in this cycle would
            # make the answer depend on how records fall into batches.
            store = self.tables[name].partition(self.partition)
            tables[name] = TableView(name, store, ordered=name in self._ordered)
        return Batch(pipeline.name, self.partition, records, tables, cache, self.parses)

    def _keep_one(
        self, pipeline: Pipeline, batch: Batch, record: SourceRecord, work: _Work
    ) -> None:
        self._keep(batch, work, record)
        work.produced.extend(
            Produced(out, record.timestamp, pipeline.name, record) for out in batch.outputs
        )

    def _keep(self, batch: Batch, work: _Work, record: SourceRecord | None) -> None:
        made = work.provenance
        for name, view in batch.tables.items():
            if view.parent is None:  # a lookup's view has nothing to take in
                continue
            work.written[(batch.pipeline, name)] += len(view)
            if len(view):
                made.table_writers.setdefault(name, set()).add(batch.pipeline)
                for key in view.written():  # the last writer, when it is one record
                    if record is not None:
                        made.writers[(name, key)] = record
                    else:
                        made.writers.pop((name, key), None)
            view.merge_into_parent()
        for topic, records in batch.records.items():
            work.read[(batch.pipeline, topic)] += len(records)
        work.events[batch.pipeline] += sum(len(rs) for rs in batch.records.values())
        work.sent.update((batch.pipeline, output.topic) for output in batch.outputs)
        if batch.counts:
            work.steps.update(batch.counts)
        for topic, n in batch.dead_lettered.items():
            work.dead_letters[topic] += n

    def _is_dead_letter(self, out: Output) -> bool:
        return out.topic in self._dead_letter_topics and any(
            name == ERROR_HEADER for name, _ in out.headers or ()
        )

    def _finish(
        self,
        records: dict[str, Sequence[SourceRecord]],
        views: Mapping[str, TableView],
        fed: set[str],
        work: _Work,
        offsets: Mapping[TP, int],
        now_ms: int,
    ) -> Cycle:
        """The cycle's changelog records and outputs, stamped and checked."""
        cycle_ids = {record_id(r) for rs in records.values() for r in rs}
        for rid, (culprit, reason) in self.plan.culprits.items():
            if rid in cycle_ids:
                letter = dead_letter_record(culprit, reason[:1000])
                work.produced.append(Produced(letter, culprit.timestamp, None, culprit))
                work.dead_letters[culprit.topic] += 1
                work.refused[(culprit.topic, error_name(reason))] += 1
        refusals: list[Refused] = []
        changes: dict[str, dict[bytes, bytes | None]] = {}
        state: list[Output] = []
        for name, view in views.items():
            if not (len(view) or name in fed):
                continue
            items = changes[name] = view.changes()
            items[POSITION_KEY] = self._position(name, offsets)
            topic = self.tables[name].changelog_topic
            limits, max_bytes = self.limits.of(topic), self.limits.max_bytes(topic)
            for key, value in items.items():
                record = Output(topic, key, value, self.partition)
                why = refusal(topic, key, value, None, None, limits, now_ms, max_bytes)
                if why is not None:
                    refusals.append(
                        Refused(f"{why} (table {name}, key {key!r})", table=name, key=key)
                    )
                state.append(record)
                work.provenance.logged[id(record)] = (name, key)
        landed = Counter(self.landed)
        outputs = [self._stamped(p, work, refusals, now_ms, landed) for p in work.produced]
        return Cycle([o for o in outputs if o is not None], state, changes, refusals, work)

    def _stamped(
        self,
        produced: Produced,
        work: _Work,
        refusals: list[Refused],
        now_ms: int,
        landed: Counter[tuple[Any, ...]],
    ) -> Output | None:
        """The output as it is sent (timed, a dead letter made to fit), or None when its
        topic would refuse it or Kafka holds it from a failed attempt at the cycle."""
        out, topic = produced.output, produced.output.topic
        limits, max_bytes = self.limits.of(topic), self.limits.max_bytes(topic)
        if self._is_dead_letter(out):
            out = fit_dead_letter(out, max_bytes)
        if landed and landed[_identity(out)] > 0:
            landed[_identity(out)] -= 1
            return None
        if out.timestamp_ms is None:
            out = out._replace(timestamp_ms=stamp(produced.at_ms, limits, now_ms))
        why = refusal(
            topic, out.key, out.value, out.headers, out.timestamp_ms, limits, now_ms, max_bytes
        )
        if why is not None:
            refusals.append(Refused(why, produced.pipeline, source=produced.source))
            return None
        work.provenance.made[id(out)] = produced
        return out

    def _count(self, work: _Work) -> None:
        figures = self.figures
        figures.events.update(work.events)
        figures.dead_letters.update(work.dead_letters)
        figures.failed_records.update(work.failed)
        figures.refused_records.update(work.refused)
        figures.steps.update(work.steps)
        figures.read.update(work.read)
        figures.written.update(work.written)
        figures.sent.update(work.sent)

    def learn(self, failure: EngineFailure) -> tuple[bool, frozenset[str]]:
        """Whether the failed cycle is worth another attempt at once, and the topics
        whose rules to read again first."""
        if not isinstance(failure, CycleFailed):
            return False, frozenset()
        lesson = learn_failure(self.plan, failure.undelivered, self.provenance)
        return lesson.retry, lesson.topics


class Engine:
    """The tasks of one worker and the one owner of their commit cycle (the module's
    docstring gives its order and its rules).

    ``exactly_once``: the processing guarantee, decided once by the settings."""

    def __init__(
        self,
        pipelines: Sequence[Pipeline],
        tables: Mapping[str, TableStore],
        connector: Connector,
        *,
        partitions: int,
        exactly_once: bool,
    ) -> None:
        self.pipelines = list(pipelines)
        self.tables = dict(tables)
        self.connector = connector
        self.partitions = partitions
        self.exactly_once = exactly_once
        self.lineage = Lineage.of(self.pipelines)
        #: called after each cycle's writes reach a table partition (the query layer's
        #: waits and change streams)
        self.listeners: list[Listener] = []
        self.topics = frozenset(topic for p in pipelines for topic in p.reads)
        written = {spec.name for p in pipelines for spec in p.writes}
        written |= {name for p in pipelines for name in p.lookups}
        if missing := written - set(tables):
            raise ValueError(f"pipelines write undeclared tables: {sorted(missing)}")
        #: every topic the engine sends to
        self.sends = frozenset(
            {t for p in pipelines for t in p.produces}
            | {dlq_topic(t) for t in self.topics}
            | {store.changelog_topic for store in self.tables.values()}
        )
        self.tasks: dict[int, Task] = {}
        self.figures = Figures()
        self.limits = Limits()
        #: partitions whose last cycle failed, until one succeeds
        self.stalls: dict[int, Stall] = {}
        #: why the engine stopped for good (a store failed), or None
        self.failure: str | None = None
        self._lock = asyncio.Lock()
        #: tasks kept through a rebalance whose offsets are not yet checked against the
        #: group's committed ones
        self._kept: set[int] = set()

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

    # -- the fetch loop's one call ----------------------------------------------------

    async def offer(
        self,
        fetched: Mapping[Any, Sequence[SourceRecord]],
        positions: Mapping[Any, int],
        *,
        settled: bool = True,
    ) -> None:
        """Hand one fetch to the engine; every failure is handled here (see the module's
        docstring). What it does not apply is fetched again: the consumer's position is
        past it, and a partition that receives nothing more would never start its task
        to seek back.

        ``settled`` is False when the group is rebalancing or the fetch belongs to an
        earlier generation: nothing is applied, the records come back once it settled,
        to the tasks the new assignment kept (:meth:`keep`) or to new ones started from
        the committed offsets. Cancelled (the worker stops), the cycle in flight gets
        :data:`STOP_WAIT_S` to take effect and is then cut short."""
        if not fetched or self.failure is not None:
            return
        cycle = asyncio.ensure_future(self._offer(fetched, positions, settled))
        try:
            retry = await asyncio.shield(cycle)
        except asyncio.CancelledError:
            await self._cut_short(cycle)
            raise
        if retry:
            await asyncio.sleep(KAFKA_RETRY_S)

    async def _offer(
        self,
        fetched: Mapping[Any, Sequence[SourceRecord]],
        positions: Mapping[Any, int],
        settled: bool,
    ) -> bool:
        """One fetch's cycle; True when the tasks start again after a pause."""
        if not settled:
            await self.refetch(fetched)
            return False
        try:
            await self.process(fetched, positions)
        except StoreFailure as exc:
            self.fail(str(exc))
            await self.revoke()
        except EngineFailure as exc:
            # Not one task's failure (those stall on their own): the group's commit or
            # its committed offsets. Every task starts again from the committed offsets.
            await self.revoke()
            await self.refetch(fetched)
            logger.warning(
                "%s; the tasks start again from the committed offsets in %.0f s",
                exc,
                KAFKA_RETRY_S,
            )
            return True
        return False

    async def _cut_short(self, cycle: asyncio.Future[bool]) -> None:
        """At a stop: the cycle in flight takes effect (or fails) as a whole, unless a
        rebalance under the stop leaves it waiting on a consumer closed meanwhile. Cut
        short, it is like a kill -9: nothing of it took effect past what Kafka holds, and
        the partitions' next owners redo it from the committed offsets."""
        if cycle.done():
            return
        try:
            await asyncio.wait_for(asyncio.shield(cycle), STOP_WAIT_S)
        except TimeoutError:
            logger.warning(
                "the cycle in flight did not finish within %.0f s of the stop; it "
                "is cut short and redone from the committed offsets",
                STOP_WAIT_S,
            )
            cycle.cancel()

    async def refetch(self, fetched: Mapping[Any, Sequence[SourceRecord]]) -> None:
        """Seek each fetched source partition back to its first fetched record."""
        again = {
            TP(tp.topic, tp.partition): records[0].offset
            for tp, records in fetched.items()
            if records and tp.topic in self.topics
        }
        if again:
            await self.connector.seek(again)

    # -- the commit cycle ---------------------------------------------------------------

    async def process(
        self, fetched: Mapping[Any, Sequence[SourceRecord]], positions: Mapping[Any, int]
    ) -> None:
        """One engine cycle over everything fetched: each task's cycle (tasks in
        parallel), then the group's commit under at_least_once. Raises
        :class:`StoreFailure`, and :class:`EngineFailure` when the group's commit failed.

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
            if self._kept:
                await self._verify_kept()
            runs, starts = [], []
            for partition, fetched_here in sorted(by_partition.items()):
                stall = self.stalls.get(partition)
                if stall is not None and not stall.due(started):
                    await self._hold(stall, fetched_here)
                    continue
                task = self.tasks.get(partition)
                if task is None:
                    starts.append((partition, fetched_here))
                    continue
                runs.append((task, fetched_here))
            # The partitions a rebalance brought start together: each opens its producer
            # (a transactional one under exactly_once) and reads its committed offsets.
            await asyncio.gather(*(self._start_or_stall(p, f) for p, f in starts))
            if not runs:
                return
            await self._commit(await self._run(runs, moved))
            self.figures.cycles += 1
            self.figures.cycle_seconds += time.monotonic() - started

    async def _attempt(
        self, task: Task, fetched: Mapping[TP, Sequence[SourceRecord]], moved: Mapping[TP, int]
    ) -> dict[TP, int]:
        """One attempt at a task's cycle, in the cycle's order; the offsets it moved on
        (what to commit)."""
        begun = task.begin(fetched, moved)
        if begun is None:
            return {}
        records, offsets = begun
        try:
            cycle = task.build(records, offsets)  # the pipelines, on views; checked
            written = await self._produce(task, cycle, offsets)  # Kafka holds the cycle
            task.took(cycle, offsets)
            self._store(task, cycle, written)  # then the stores, then the listeners
        finally:
            task.busy_since = None
        task.end(offsets)
        return offsets

    async def _produce(self, task: Task, cycle: Cycle, offsets: Mapping[TP, int]) -> dict[TP, int]:
        """Make Kafka hold the cycle; the last offset written per partition. Raises
        :class:`CycleFailed` when Kafka did not take some record batches, and
        :class:`EngineFailure` when it failed otherwise."""
        producer, plan = task.producer, task.sending(cycle)
        task.waiting = True
        try:
            if self.exactly_once:
                # One transaction: changelogs, outputs and the source offsets. A new
                # owner's producer fences this one, and aborts what it left open.
                async with producer.transaction():
                    written = await producer.send([*cycle.state, *cycle.outputs], plan)
                    if offsets:
                        await producer.send_offsets(offsets)
                return written
            # at_least_once: the outputs are acknowledged before any changelog record
            # goes. A crash in between sends the outputs again, and never leaves a
            # changelog saying a record was applied (a join's dedupe by offset) while its
            # outputs were lost. The offsets go with the group's commit (_commit).
            try:
                written = await producer.send(cycle.outputs, plan) if cycle.outputs else {}
            except Undelivered as undelivered:
                task.kept(undelivered.taken)
                raise
            if cycle.state:
                try:
                    written.update(await producer.send(cycle.state, plan))
                except Undelivered as undelivered:
                    task.kept([*cycle.outputs, *undelivered.taken])
                    raise
            return written
        except Exception as exc:
            # An abort that failed too still says which batches Kafka did not take.
            refused = undelivered_in(exc)
            if refused is not None:
                raise CycleFailed(task.partition, refused) from refused
            raise EngineFailure(
                f"task {task.partition}: Kafka did not take the batch: {exc!r}"
            ) from exc
        finally:
            task.waiting = False

    def _store(self, task: Task, cycle: Cycle, written: Mapping[TP, int]) -> None:
        """Kafka holds the cycle: its writes reach the stores, each table partition's
        with the changelog offset it reaches; then the listeners hear of them."""
        try:
            for name, items in cycle.changes.items():
                store = self.tables[name]
                offset = written.get(TP(store.changelog_topic, task.partition))
                store.apply(task.partition, items, offset)
        except Exception as exc:
            raise StoreFailure(f"task {task.partition}: the store failed: {exc!r}") from exc
        for name, items in cycle.changes.items():
            for listener in self.listeners:
                try:
                    listener(name, task.partition, items, items.get(POSITION_KEY))
                except Exception:  # a listener must not stop the engine
                    logger.exception("a listener failed on %s[%d]", name, task.partition)

    async def _commit(self, committed: Mapping[TP, int]) -> None:
        """at_least_once: the group commits the offsets of the tasks whose cycles took
        effect (under exactly_once they went with each cycle's transaction)."""
        if not committed or self.exactly_once:
            return
        try:
            await self.connector.commit(committed)
        except CommitRefused as exc:
            # The group rebalanced meanwhile: the partitions' next owners process these
            # records again (at least once).
            logger.info("commit refused (%s): %d partitions are read again", exc, len(committed))
        except Exception as exc:
            raise EngineFailure(f"the offsets were not committed: {exc!r}") from exc

    async def _run(
        self,
        runs: Sequence[tuple[Task, Mapping[TP, Sequence[SourceRecord]]]],
        moved: Mapping[TP, int],
    ) -> dict[TP, int]:
        """Run the tasks' cycles; a task whose records Kafka refused tries again at once
        with what it learned (a new producer, the topics' rules read again), up to
        :data:`MAX_ROUNDS` attempts; a task that still fails stalls."""
        committed: dict[TP, int] = {}
        for round_ in range(MAX_ROUNDS):
            results = await asyncio.gather(
                *(self._attempt(task, fetched, moved) for task, fetched in runs),
                return_exceptions=True,
            )
            again, reread = [], set[str]()
            for (task, fetched), result in zip(runs, results, strict=True):
                if isinstance(result, dict):
                    committed.update(result)
                    self._moving(task.partition)
                    continue
                if not isinstance(result, EngineFailure) or isinstance(result, StoreFailure):
                    raise result
                retry, topics = task.learn(result)
                if retry and round_ + 1 < MAX_ROUNDS:
                    again.append((task, fetched))
                    reread |= topics
                    logger.info("%s; the task tries again with what Kafka said", result)
                else:
                    await self._stall(task.partition, fetched, result, task)
            if not again:
                break
            if reread:
                await self._read_limits(reread)
            for task, fetched in list(again):
                try:
                    await task.producer.reset()
                except Exception as exc:  # Kafka unreachable: the backoff takes over
                    again.remove((task, fetched))
                    failure = EngineFailure(
                        f"task {task.partition}: its producer could not be replaced: {exc!r}"
                    )
                    await self._stall(task.partition, fetched, failure, task)
            self.figures.retries["refusal"] += len(again)
            runs = again
        return committed

    # -- stalls -------------------------------------------------------------------------

    async def _stall(
        self,
        partition: int,
        fetched: Mapping[TP, Sequence[SourceRecord]],
        failure: EngineFailure,
        task: Task | None,
    ) -> None:
        """Close the task of a failed cycle, pause its partitions and schedule its next
        attempt (the records it fetched are fetched again then)."""
        stall = self.stalls.get(partition)
        # Where it is stuck: the next offset to apply, or the first record fetched for a
        # partition with nothing committed yet.
        inputs: dict[tuple[str, int], int | None] = {
            (tp.topic, tp.partition): records[0].offset
            for tp, records in fetched.items()
            if records
        }
        if task is not None:
            for tp, offset in task.checkpoint.next.items():
                if offset is not None or (tp.topic, tp.partition) not in inputs:
                    inputs[(tp.topic, tp.partition)] = offset
        if stall is None:
            stall = self.stalls[partition] = Stall(partition, "", "", inputs)
        stall.inputs = inputs
        if task is not None:
            self.tasks.pop(partition, None)
            stall.plan = task.plan
            stall.failed = (
                {f.tp for f in failure.undelivered.failures}
                if isinstance(failure, CycleFailed)
                else set()
            )
            try:
                await task.producer.close()
            except Exception:  # its next start replaces (and fences) the producer anyway
                logger.warning("task %d: its producer did not close", partition, exc_info=True)
        cause = failure.__cause__ if failure.__cause__ is not None else failure
        wait = backoff(stall.attempts + 1)
        stall.failed_again(str(failure), type(cause).__name__, time.monotonic() + wait)
        if stall.attempts >= ISOLATE_AFTER:
            stall.plan.isolate |= stall.failed
        self.figures.retries["backoff"] += 1
        logger.warning(
            "%s; partition %d pauses and tries again in %.0f s (attempt %d failed; stuck at %s)",
            failure,
            partition,
            wait,
            stall.attempts,
            ", ".join(f"{t}[{p}]@{o}" for (t, p), o in sorted(inputs.items())) or "its start",
        )
        await self._hold(stall, fetched)

    async def _hold(self, stall: Stall, fetched: Mapping[TP, Sequence[SourceRecord]]) -> None:
        """Keep a stalled partition's records for its next attempt."""
        tps = self.connector.assigned(stall.partition, self.topics)
        self.connector.pause(tps)
        stall.paused = True
        await self.refetch(fetched)

    def _moving(self, partition: int) -> None:
        stall = self.stalls.pop(partition, None)
        if stall is not None:
            logger.info(
                "partition %d moves again after %d failed attempts in %.1f s",
                partition,
                stall.attempts,
                time.monotonic() - stall.since,
            )

    async def tick(self) -> None:
        """Resume the stalled partitions whose next attempt is due (the fetch loop calls
        this at least once a second)."""
        if not self.stalls:
            return
        async with self._lock:
            now = time.monotonic()
            for partition, stall in list(self.stalls.items()):
                tps = self.connector.assigned(partition, self.topics)
                if not tps and partition not in self.tasks:
                    del self.stalls[partition]  # no longer this worker's
                    continue
                if stall.paused and stall.due(now):
                    self.connector.resume(tps)
                    stall.paused = False

    def stalled(self) -> list[dict[str, Any]]:
        """The partitions that cannot advance: their last cycle failed, or their cycle has
        been in flight for :data:`SLOW_CYCLE_S` or more."""
        now = time.monotonic()
        found = [
            stall.report(now)
            for partition, stall in sorted(self.stalls.items())
            if self.connector.assigned(partition, self.topics)
        ]
        for partition, task in sorted(self.tasks.items()):
            busy = task.busy_since
            if busy is not None and now - busy >= SLOW_CYCLE_S and partition not in self.stalls:
                found.append(slow_report(partition, task.busy_at, now - busy, task.waiting))
        return found

    # -- tasks --------------------------------------------------------------------------

    async def _read_limits(self, topics: Iterable[str]) -> None:
        """Read the rules of ``topics`` from Kafka; Kafka's defaults stay for the topics it
        does not describe."""
        try:
            found = await self.connector.limits(sorted(topics))
        except Exception as exc:  # the broker answers later: the defaults hold meanwhile
            logger.warning("the topics' limits could not be read: %r", exc)
            return
        self.limits.topics.update(found)
        self.limits.read = True

    async def _start_or_stall(
        self, partition: int, fetched: Mapping[TP, Sequence[SourceRecord]]
    ) -> None:
        try:
            await self._start(partition, fetched)
        except EngineFailure as exc:
            await self._stall(partition, fetched, exc, None)

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
        if not self.limits.read:
            await self._read_limits(self.sends)
        # exactly_once: a transactional producer of the task's own, whose start fences
        # the partition's previous owner (so the committed offsets read next are final);
        # at_least_once: the worker's idempotent producer.
        producer = self.connector.producer(partition, transactional=self.exactly_once)
        try:
            await producer.open()
        except Exception as exc:
            raise EngineFailure(f"task {partition}: its producer did not start: {exc!r}") from exc
        tps = sorted(set(self.connector.assigned(partition, self.topics)) | set(fetched))
        try:
            committed = await self.connector.committed(tps)
            await self.connector.seek(committed)
        except Exception as exc:
            await producer.close()
            raise EngineFailure(f"task {partition}: no committed offsets: {exc!r}") from exc
        task = Task(
            partition,
            self.pipelines,
            self.tables,
            producer,
            self.figures,
            lineage=self.lineage,
            partitions=self.partitions,
            limits=self.limits,
        )
        task.load_positions()
        task.checkpoint.update({tp: o for tp, o in committed.items() if o is not None})
        for tp, offset in committed.items():
            task.checkpoint.next.setdefault(tp, offset)
        stall = self.stalls.get(partition)
        if stall is not None:
            task.plan = stall.plan
        self.tasks[partition] = task
        logger.info(
            "task %d started at %s",
            partition,
            ", ".join(f"{tp.topic}={o}" for tp, o in sorted(committed.items())),
        )

    async def suspend(self) -> None:
        """The group is rebalancing: finish the cycle in flight (its offsets committed
        under the generation that applied it) and keep every task. The eager protocol
        revokes every partition at every rebalance, and most come back to the same
        worker: their tasks go on with their producers and applied offsets, and only
        those of the partitions that went elsewhere close (:meth:`keep`)."""
        async with self._lock:
            if self.tasks:
                logger.info("tasks %s suspended for the rebalance", sorted(self.tasks))

    async def keep(self, partitions: Collection[int]) -> None:
        """The group's new assignment gives this worker ``partitions``: close the tasks
        of the others. Every assignment passes here before anything is processed under
        it, so a kept task's applied offsets are the partition's last ones: no other
        worker held it in between."""
        async with self._lock:
            gone = {p: task for p, task in self.tasks.items() if p not in partitions}
            for partition in gone:
                del self.tasks[partition]
            self._kept = set(self.tasks)
            await asyncio.gather(*(task.producer.close() for task in gone.values()))
            kept = sorted(self.tasks)
            logger.info(
                "assignment of partitions %s: tasks %s kept, %s closed",
                sorted(partitions),
                kept,
                sorted(gone),
            )

    async def _verify_kept(self) -> None:
        """Close the kept tasks whose partitions another worker committed past their
        applied offsets meanwhile (this worker was out of the group for a generation, its
        session timed out): their state and producers are stale, and they start again
        from the committed offsets. A kept task may be ahead of the committed offsets (a
        commit refused by the rebalance): what it applied is not applied twice."""
        kept, self._kept = self._kept, set()
        tasks = {p: self.tasks[p] for p in kept if p in self.tasks}
        tps = [tp for task in tasks.values() for tp in task.checkpoint.next]
        try:
            committed = await self.connector.committed(tps) if tps else {}
        except Exception as exc:
            raise EngineFailure(f"the kept tasks' committed offsets: {exc!r}") from exc
        stale = {
            partition
            for partition, task in tasks.items()
            for tp, applied in task.checkpoint.next.items()
            if (found := committed.get(tp)) is not None and found > (applied or 0)
        }
        for partition in sorted(stale):
            task = self.tasks.pop(partition)
            await task.producer.close()
            logger.warning(
                "task %d closed: the group committed past its offsets while this worker "
                "was out of it; it starts again from the committed offsets",
                partition,
            )

    async def revoke(self) -> None:
        """Finish the cycle in flight, then close every task (they start again from the
        committed offsets): at a stop, a failed store or a failed commit."""
        async with self._lock:
            tasks, self.tasks = self.tasks, {}
            self._kept = set()
            await asyncio.gather(*(task.producer.close() for task in tasks.values()))
            if tasks:
                logger.info("tasks %s closed", sorted(tasks))

    async def close(self) -> None:
        """At the worker's stop: every task closes, then the connector's producers."""
        await self.revoke()
        await self.connector.close()

    def lag(self, highwaters: Mapping[Any, int]) -> dict[TP, int]:
        """Records between each source partition's end and its task's checkpoint."""
        lag = {}
        for task in self.tasks.values():
            for tp, offset in task.checkpoint.next.items():
                end = highwaters.get(tp)
                if end is not None:
                    lag[tp] = max(0, end - (offset or 0))
        return lag
