"""What one task's cycle makes: the pipelines over its fetched records, on views of its
tables, with every record it would send checked against its topic's rules.

A :class:`Task` holds partition ``p`` of every source topic and every table on this
worker: its :class:`Checkpoint` (the offsets it applied), the positions it carries
(:mod:`tables.positions`), what refusals taught it (:class:`~tables.refusals.Plan`) and
its producer. It builds a :class:`Cycle` (:meth:`Task.build`); making the cycle take
effect, and every rule of what follows when it does not, is the engine's
(:mod:`tables.engine`).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from core.topics import POSITION_KEY, dlq_topic
from tables.limits import MAX_REQUEST_BYTES, TopicLimits, refusal, stamp
from tables.pipeline import (
    ERROR_HEADER,
    TP,
    Batch,
    Output,
    Pipeline,
    SourceRecord,
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
    error_name,
    fit_dead_letter,
    record_id,
)

if TYPE_CHECKING:
    from tables.engine import Producer, TableStore

logger = logging.getLogger(__name__)

#: Records per batch at most when a pipeline's effects are checked batch by batch.
CHECKED_BATCH = 64


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
class Counts:
    """Records counted by what became of them: per cycle (:class:`_Work`) and in total
    (:class:`Figures`, which adds each cycle's that took effect)."""

    events: Counter[str] = field(default_factory=Counter)
    #: records through each named step of the pipelines (Batch.counts)
    steps: Counter[str] = field(default_factory=Counter)
    dead_letters: Counter[str] = field(default_factory=Counter)
    failed_records: Counter[str] = field(default_factory=Counter)
    #: input records sent to a dead-letter topic because Kafka refused (or would refuse)
    #: their effects, by (source topic, Kafka's error)
    refused_records: Counter[tuple[str, str]] = field(default_factory=Counter)
    #: (pipeline, topic): records a pipeline applied of a topic it reads
    read: Counter[tuple[str, str]] = field(default_factory=Counter)
    #: (pipeline, table): keys a pipeline's batches wrote (changelog records)
    written: Counter[tuple[str, str]] = field(default_factory=Counter)
    #: (pipeline, topic): records a pipeline sent, dead letters included
    sent: Counter[tuple[str, str]] = field(default_factory=Counter)

    def add(self, other: Counts) -> None:
        for name in _COUNTERS:
            getattr(self, name).update(getattr(other, name))


_COUNTERS = tuple(f.name for f in fields(Counts))


@dataclass
class Figures(Counts):
    """What the engine has done, read by the metrics at scrape time."""

    #: attempts at a cycle after a failed one, by cause (refusal: in the same engine
    #: cycle; backoff: after a pause)
    retries: Counter[str] = field(default_factory=Counter)
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
class _Work(Counts):
    """What the passes over one cycle's records collect."""

    produced: list[Produced] = field(default_factory=list)
    provenance: Provenance = field(default_factory=Provenance)


@dataclass
class Cycle:
    """One cycle ready to take effect: what goes to Kafka and to the stores."""

    outputs: list[Output]
    state: list[Output]
    changes: dict[str, dict[bytes, bytes | None]]
    refusals: list[Refused]
    work: _Work


def _produced(batch: Batch, at_ms: int, pipeline: str) -> Iterator[Produced]:
    """A batch's outputs, each timed by its own input where the step gave it, else by the
    batch's latest input ``at_ms``."""
    inputs = batch.input_times
    for n, out in enumerate(batch.outputs):
        yield Produced(out, inputs.get(n, at_ms), pipeline, None)


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
        self.figures.add(cycle.work)

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
        """One pass of the pipelines over the cycle's records, on views of the tables:
        what the cycle makes, and what of it its topics would refuse."""
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
        work.produced.extend(_produced(batch, at_ms, pipeline.name))

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
        work.produced.extend(_produced(batch, at_ms, pipeline.name))

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
            letter = dead_letter_record(record, reason[:1000], pipeline.name)
            work.produced.append(Produced(letter, record.timestamp, pipeline.name, record))
            work.sent[(pipeline.name, letter.topic)] += 1
            work.dead_letters[record.topic] += 1
            work.failed_records[pipeline.name] += 1
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
            for key, raw, unencoded in view.encoded(watched):
                if unencoded is not None:
                    return f"TableValueError: {unencoded}"
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
        culprits = self.plan.culprits
        cycle_ids = {record_id(r) for rs in records.values() for r in rs} if culprits else ()
        for rid, (culprit, reason) in culprits.items():
            if rid in cycle_ids:
                letter = dead_letter_record(culprit, reason[:1000])
                work.produced.append(Produced(letter, culprit.timestamp, None, culprit))
                work.dead_letters[culprit.topic] += 1
                work.refused_records[(culprit.topic, error_name(reason))] += 1
        refusals: list[Refused] = []
        changes: dict[str, dict[bytes, bytes | None]] = {}
        state: list[Output] = []
        for name, view in views.items():
            if not (len(view) or name in fed):
                continue
            try:
                items = view.changes()
            except TypeError:  # a value with no JSON encoding: refused, as Kafka would
                items, failed = view.checked_changes()
                for key, unencoded in failed.items():
                    refusals.append(Refused(f"TableValueError: {unencoded}", table=name, key=key))
            changes[name] = items
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
