"""Pipelines replayed over retained records, as the engine runs them, without Kafka.

A :class:`PartitionReplay` is what a worker's task is for one partition number: it hands
each pipeline the records of its topics in cycles (:class:`tables.pipeline.Batch`), with
table views over in-memory stores, and keeps what the batch functions did: table writes,
and the records they send to topics that other pipelines read (repartition topics). A
batch that raises is applied again record by record and a record that still raises is
left out, as the engine sends it to its dead-letter topic. Nothing here imports Spark:
the job's Spark tasks feed it (``jobs/tasks.py``), and tests run it in process.

The one step replayed otherwise is the windowed stream join: the engine buffers both
sides in changelogged tables and decides each pair as the second record arrives, which
costs tens of microseconds a record. Its outcome depends only on each record's event
time and the event time of its own side when it arrived (``tables.join``), so the
replay keeps those for the whole partition and decides every pair at the end
(:class:`DeferredJoinRunner`), then runs the steps after the join on the result.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import accumulate, compress, repeat
from typing import Any, NamedTuple

from sortedcontainers import SortedDict

from core.values import InvalidEvent
from streams.compile import Plan
from streams.runtime import Rows, Runner, text_key
from streams.topology import Node
from tables.global_table import GlobalSpec, MemoryGlobalTable, Versions
from tables.join import JoinWindow
from tables.pipeline import Batch, Output, Pipeline, SourceRecord, TableSpec, TableView
from tables.windows import parse_window_range, window_end_ms

Process = Callable[[Batch], None]
#: No size limit: values a join buffered were checked when they were read.
BIG = 1 << 62


class _Absent:
    """No value (a missing cache entry, a joiner that raised)."""


_ABSENT = _Absent()


class Rec(NamedTuple):
    """A retained record as a batch function reads it (cheap to build by the million)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int


class MemoryStore:
    """One table partition in memory: raw keys to raw values, ordered when scanned."""

    __slots__ = ("data", "ordered")

    def __init__(self, ordered: bool) -> None:
        self.ordered = ordered
        self.data: dict[bytes, bytes] = SortedDict() if ordered else {}

    def get(self, key: bytes) -> bytes | None:
        return self.data.get(key)

    def items(self, start: bytes) -> Iterator[tuple[bytes, bytes]]:
        if not self.ordered:
            raise TypeError("scans need an ordered store")
        data: Any = self.data
        for key in data.irange(minimum=start):
            yield key, data[key]

    def apply(self, changes: Mapping[bytes, bytes | None]) -> None:
        for key, value in changes.items():
            if value is None:
                self.data.pop(key, None)
            else:
                self.data[key] = value


# -- the stream join, decided once the partition is read ----------------------------------


@dataclass
class JoinSide:
    """One side of a join on one partition: its event time (the largest ``ts`` of its
    topic's valid records so far) and its joinable records, as columns: join key, ts,
    the side's event time when the record arrived, record key, encoded value. Columns of
    plain values, not a tuple per record: millions of tuples kept alive make every
    garbage collection walk them."""

    mark: int | None = None
    join_keys: list[str] = field(default_factory=list)
    times: list[int] = field(default_factory=list)
    marks: list[int] = field(default_factory=list)
    keys: list[bytes | None] = field(default_factory=list)
    values: list[bytes] = field(default_factory=list)

    def extend(self, other: JoinSide) -> None:
        """Take the records (and the event time) of a batch that took effect."""
        if other.mark is not None:
            self.mark = other.mark
        self.join_keys += other.join_keys
        self.times += other.times
        self.marks += other.marks
        self.keys += other.keys
        self.values += other.values

    def rows(self) -> Iterator[tuple[str, int, int, bytes | None, bytes]]:
        return zip(self.join_keys, self.times, self.marks, self.keys, self.values, strict=True)


@dataclass
class JoinState:
    left: JoinSide = field(default_factory=JoinSide)
    right: JoinSide = field(default_factory=JoinSide)


class DeferredJoinRunner(Runner):
    """A pipeline's batch function whose stream joins emit nothing until
    :meth:`flush`: each batch only records its join inputs (taken back with
    :meth:`rollback` when the batch raises); the flush batch emits every pair the
    engine's join would have emitted by the end of the records, and every left record
    it would have given up on, and the steps after the join run on them."""

    def __init__(self, plan: Plan) -> None:
        super().__init__(plan)
        self.joins: dict[int, JoinState] = {}
        self._pending: dict[int, JoinState] = {}
        self._flush: dict[int, Rows] | None = None
        self.failed_pairs = 0

    @property
    def joined(self) -> bool:
        return any(node.op == "join_stream" for node in self.plan.steps)

    def commit(self) -> None:
        """The last batch took effect: its join inputs are kept."""
        for node_id, pending in self._pending.items():
            state = self.joins.setdefault(node_id, JoinState())
            state.left.extend(pending.left)
            state.right.extend(pending.right)
        self._pending = {}

    def rollback(self) -> None:
        self._pending = {}

    def flush_rows(self) -> dict[int, Rows]:
        """The result of every stream join of the plan, by join step."""
        found = {}
        for node in self.plan.steps:
            if node.op == "join_stream":
                found[node.id] = self._decide(node, self.joins.get(node.id, JoinState()))
        return found

    def flush(self, batch: Batch, rows: Mapping[int, Rows]) -> None:
        """Run the steps after the joins on ``rows`` (see :meth:`flush_rows`)."""
        self._flush = dict(rows)
        try:
            self(batch)
        finally:
            self._flush = None

    def _join_stream(
        self, batch: Batch, node: Node, results: dict[int, Rows], sources: dict[str, Rows]
    ) -> Rows:
        if self._flush is not None:
            return self._flush.get(node.id, Rows([], [], [], None, None))
        state = self.joins.get(node.id, JoinState())
        pending = self._pending.setdefault(node.id, JoinState())
        params = node.params
        left_node, right_node = node.parents
        for side_state, into, side_node, key_fn in (
            (state.left, pending.left, left_node, params["key"]),
            (state.right, pending.right, right_node, params["other_key"]),
        ):
            rows = results[side_node.id]
            assert rows.topic is not None
            assert rows.index is not None
            source = sources[rows.topic]
            assert source.index is not None
            assert source.times is not None
            before = side_state.mark if into.mark is None else into.mark
            # Each record's side event time: the largest ts of its topic up to it.
            marks = (
                list(accumulate(source.times, max, initial=before))[1:]
                if before is not None
                else list(accumulate(source.times, max))
            )
            if marks:
                into.mark = marks[-1]
            if not rows.values:
                continue
            if rows.index == source.index:
                positions: Iterable[int] = range(len(rows.index))
            elif source.index and source.index[-1] == len(source.index) - 1:
                positions = rows.index  # every source record is a row: index is position
            else:
                positions = [bisect_left(source.index, i) for i in rows.index]
            joined: Iterable[Any] = rows.keys or () if key_fn is None else map(key_fn, rows.values)
            into.join_keys += map(text_key, joined)
            into.times += map(source.times.__getitem__, positions)
            into.marks += map(marks.__getitem__, positions)
            into.keys += rows.keys or [None] * len(rows.values)
            into.values += map(side_node.value_type.encode, rows.values)
        return Rows([], [], [], None, None)

    def _decide(self, node: Node, state: JoinState) -> Rows:
        """Every pair (``joiner(left, right)``, keyed by the left record, at the later
        ts) and, for a left join, every left record that matched nothing and that event
        time on both sides has passed (``joiner(left, None)``)."""
        params = node.params
        window: JoinWindow = params["window"]
        joiner = params["joiner"]
        left_node, right_node = node.parents
        left_parse, right_parse = left_node.value_type.parse, right_node.value_type.parse
        rights: dict[str, list[tuple[int, int, bytes]]] = {}
        for join_key, ts, mark, _key, raw in state.right.rows():
            rights.setdefault(join_key, []).append((ts, mark, raw))
        limit = window.left_limit(state.left.mark, state.right.mark)
        # A left join decides a left record alone once event time passed ``horizon``.
        horizon = limit if params["how"] == "left" else None
        left = state.left
        stored = {key: _stored_key(key) for key in set(left.keys)}
        values: list[Any] = []
        keys: list[bytes | None] = []
        times: list[int] = []
        # Left records that nothing matched, decided alone: their places in ``values``
        # and their encoded values, joined with None together once the loop is done.
        alone: list[int] = []
        alone_raw: list[bytes] = []

        def decide_alone(begin: int, end: int) -> None:
            """The left records in [begin, end), none with a right of its join key."""
            if horizon is None or begin >= end:
                return
            mine = left.times[begin:end]
            picked = list(compress(range(begin, end), [ts < horizon for ts in mine]))
            alone.extend(range(len(values), len(values) + len(picked)))
            alone_raw.extend(map(left.values.__getitem__, picked))
            values.extend(repeat(None, len(picked)))
            keys.extend(map(stored.__getitem__, map(left.keys.__getitem__, picked)))
            times.extend(map(left.times.__getitem__, picked))

        # Only the left records with a right of their join key are looked at one by
        # one; the runs between them are decided a column at a time.
        begin = 0
        for i in compress(range(len(left.join_keys)), map(rights.__contains__, left.join_keys)):
            decide_alone(begin, i)
            begin = i + 1
            ts, mark, raw = left.times[i], left.marks[i], left.values[i]
            matched = False
            for r_ts, r_mark, r_raw in rights[left.join_keys[i]]:
                if window.matches(ts, mark, r_ts, r_mark):
                    matched = True
                    joined = self._joined(joiner, left_parse(raw, BIG), right_parse(r_raw, BIG))
                    if joined is not _ABSENT:
                        values.append(joined)
                        keys.append(stored[left.keys[i]])
                        times.append(max(ts, r_ts))
            if not matched:
                decide_alone(i, i + 1)
        decide_alone(begin, len(left.join_keys))
        if alone:
            for place, joined in zip(alone, self._alone(joiner, left_node, alone_raw), strict=True):
                values[place] = joined
            if self.failed_pairs:
                kept = [n for n, v in enumerate(values) if v is not _ABSENT]
                values = [values[n] for n in kept]
                keys = [keys[n] for n in kept]
                times = [times[n] for n in kept]
        return Rows(values, keys, times, None, None)

    def _alone(self, joiner: Callable[[Any, Any], Any], side: Node, raws: list[bytes]) -> list[Any]:
        """``joiner(left, None)`` of each encoded left value, parsed as :meth:`_decide`
        parses one (``_ABSENT`` where the joiner raised), the joiner called once per
        value: one pass over the batch when every value parses, else one at a time."""
        parse_many = getattr(side.value_type, "parse_many", None)
        if parse_many is not None:
            parsed = parse_many(raws, BIG)
            if not any(isinstance(value, InvalidEvent) for value in parsed):
                found: list[Any] = []
                calls = map(joiner, parsed, repeat(None))
                while True:
                    # extend keeps what the calls gave before one raised; the map goes
                    # on with the value after the one whose call raised
                    try:
                        found.extend(calls)
                        return found
                    except Exception:
                        self.failed_pairs += 1
                        found.append(_ABSENT)
        parse = side.value_type.parse
        return [self._joined(joiner, parse(raw, BIG), None) for raw in raws]

    def _joined(self, joiner: Callable[[Any, Any], Any], a: Any, b: Any) -> Any:
        """``joiner(a, b)``; a joiner that raises loses that result only (the engine
        dead-letters the record that made the pair, with its pairs)."""
        try:
            return joiner(a, b)
        except Exception:
            self.failed_pairs += 1
            return _ABSENT


def _stored_key(key: bytes | None) -> bytes | None:
    """A record key as the engine's join buffer gives it back (stored as text)."""
    return None if key is None else key.decode("utf-8", "replace").encode("utf-8")


# -- one partition ---------------------------------------------------------------------------


@dataclass
class Figures:
    """What a replay counted: records per topic, dead letters per topic, records whose
    processing raised per pipeline, and the steps' own counts (late, expired)."""

    records: Counter[str] = field(default_factory=Counter)
    dead_letters: Counter[str] = field(default_factory=Counter)
    failed: Counter[str] = field(default_factory=Counter)
    steps: Counter[str] = field(default_factory=Counter)

    def merge(self, other: Figures) -> None:
        self.records.update(other.records)
        self.dead_letters.update(other.dead_letters)
        self.failed.update(other.failed)
        self.steps.update(other.steps)


class PartitionReplay:
    """The pipelines of one partition number, replayed cycle by cycle (see the module's
    docstring). ``keep``: the topics whose records are kept (what later stages read);
    ``processes``: a batch function to run instead of a pipeline's own."""

    def __init__(
        self,
        partition: int,
        pipelines: Sequence[Pipeline],
        *,
        keep: Iterable[str] = (),
        processes: Mapping[str, Process] | None = None,
    ) -> None:
        self.partition = partition
        self.pipelines = list(pipelines)
        self.keep = frozenset(keep)
        self.processes = dict(processes or {})
        self.specs: dict[str, TableSpec] = {}
        for pipeline in self.pipelines:
            for spec in pipeline.writes:
                self.specs.setdefault(spec.name, spec)
        self.stores: dict[str, MemoryStore] = {}
        self.caches: dict[str, Any] = {}
        self.outputs: list[Output] = []
        self.figures = Figures()

    def store(self, name: str) -> MemoryStore:
        found = self.stores.get(name)
        if found is None:
            spec = self.specs.get(name)
            found = self.stores[name] = MemoryStore(spec is not None and spec.ordered)
        return found

    def process_of(self, pipeline: Pipeline) -> Process:
        return self.processes.get(pipeline.name, pipeline.process)

    def cycle(self, records: Mapping[str, Sequence[SourceRecord]]) -> None:
        """One batch cycle: each pipeline with records of its topics, in order."""
        for topic, found in records.items():
            self.figures.records[topic] += len(found)
        views: dict[str, TableView] = {}
        parses: dict[Any, Any] = {}
        for pipeline in self.pipelines:
            mine = {topic: records[topic] for topic in pipeline.reads if topic in records}
            if mine:
                self._apply(pipeline, mine, views, parses)
        self._store(views)

    def finish(self) -> None:
        """Emit what deferred joins decided, running the steps after them."""
        views: dict[str, TableView] = {}
        for pipeline in self.pipelines:
            process = self.process_of(pipeline)
            if isinstance(process, DeferredJoinRunner) and process.joined:
                self._flush(pipeline, process, views)
        self._store(views)

    def _store(self, views: Mapping[str, TableView]) -> None:
        for name, view in views.items():
            if len(view):
                self.store(name).apply(view.changes())

    def _views(self, pipeline: Pipeline, views: dict[str, TableView]) -> dict[str, TableView]:
        tables = {}
        for name in (*(spec.name for spec in pipeline.writes), *pipeline.lookups):
            view = views.get(name)
            if view is None:
                spec = self.specs.get(name)
                ordered = spec is not None and spec.ordered
                view = views[name] = TableView(name, self.store(name), ordered=ordered)
            tables[name] = view.child()
        return tables

    def _batch(
        self,
        pipeline: Pipeline,
        records: Mapping[str, Sequence[SourceRecord]],
        views: dict[str, TableView],
        parses: dict[Any, Any],
    ) -> Batch:
        cache = self.caches.get(pipeline.name)
        if cache is None and pipeline.cache is not None:
            cache = self.caches[pipeline.name] = pipeline.cache()
        return Batch(
            pipeline.name, self.partition, records, self._views(pipeline, views), cache, parses
        )

    def _apply(
        self,
        pipeline: Pipeline,
        records: Mapping[str, Sequence[SourceRecord]],
        views: dict[str, TableView],
        parses: dict[Any, Any],
    ) -> None:
        process = self.process_of(pipeline)
        batch = self._batch(pipeline, records, views, parses)
        try:
            process(batch)
        except Exception:
            self._dropped(pipeline, process)
            self._one_by_one(pipeline, process, records, views)
            return
        self._keep(batch, process)

    def _one_by_one(
        self,
        pipeline: Pipeline,
        process: Process,
        records: Mapping[str, Sequence[SourceRecord]],
        views: dict[str, TableView],
    ) -> None:
        for topic in pipeline.reads:
            for record in records.get(topic, ()):
                batch = self._batch(pipeline, {topic: [record]}, views, {})
                try:
                    process(batch)
                except Exception:
                    self._dropped(pipeline, process)
                    self.figures.dead_letters[topic] += 1
                    self.figures.failed[pipeline.name] += 1
                    continue
                self._keep(batch, process)

    def _flush(
        self, pipeline: Pipeline, process: DeferredJoinRunner, views: dict[str, TableView]
    ) -> None:
        rows = process.flush_rows()
        batch = self._batch(pipeline, {}, views, {})
        try:
            process.flush(batch, rows)
        except Exception:
            self._dropped(pipeline, process)
            for node_id, found in rows.items():
                for n in range(len(found)):
                    one = {
                        node_id: Rows([found.values[n]], _at(found.keys, n), _at(found.times, n))
                    }
                    batch = self._batch(pipeline, {}, views, {})
                    try:
                        process.flush(batch, one)
                    except Exception:
                        self._dropped(pipeline, process)
                        self.figures.failed[pipeline.name] += 1
                        continue
                    self._keep(batch, process)
            return
        self._keep(batch, process)
        if process.failed_pairs:
            self.figures.failed[pipeline.name] += process.failed_pairs

    def _dropped(self, pipeline: Pipeline, process: Process) -> None:
        """A batch that raised takes nothing: its join inputs and its cache go, as the
        engine drops a pipeline's cache then."""
        self.caches.pop(pipeline.name, None)
        if isinstance(process, DeferredJoinRunner):
            process.rollback()

    def _keep(self, batch: Batch, process: Process) -> None:
        for view in batch.tables.values():
            view.merge_into_parent()
        if isinstance(process, DeferredJoinRunner):
            process.commit()
        for topic, n in batch.dead_lettered.items():
            self.figures.dead_letters[topic] += n
        for name, n in batch.counts.items():
            if name.endswith((".late", ".expired")):
                self.figures.steps[name] += n
        keep = self.keep
        self.outputs.extend(out for out in batch.outputs if out.topic in keep)

    # -- results ---------------------------------------------------------------------------

    def table_rows(self, names: Iterable[str]) -> Iterator[TableRow]:
        """The contents of the tables ``names`` this replay holds."""
        for name in names:
            store = self.stores.get(name)
            spec = self.specs.get(name)
            if store is None or spec is None:
                continue
            for key, value in store.data.items():
                yield table_row(spec, self.partition, key, value)


def _at(column: list[Any] | None, n: int) -> list[Any] | None:
    return None if column is None else [column[n]]


class TableRow(NamedTuple):
    """One key of a table: its raw key, the key it was grouped by (text), its window
    (start and end in ms, None for a table without windows) and its JSON value."""

    table: str
    partition: int
    raw_key: bytes
    key: str
    window_start: int | None
    window_end: int | None
    value: bytes


def table_row(spec: TableSpec, partition: int, key: bytes, value: bytes) -> TableRow:
    """A table's stored key and value as a row; a window key is read as its key and
    window (a key that is no window key keeps its text and no window)."""
    window = spec.window
    if window is not None:
        found = parse_window_range(key)
        if found is not None:
            end = window_end_ms(window, found[1], found[2])
            return TableRow(spec.name, partition, key, found[0], found[1], end, value)
    return TableRow(spec.name, partition, key, key.decode("utf-8", "replace"), None, None, value)


# -- global tables ------------------------------------------------------------------------------


class ReplayGlobal(MemoryGlobalTable):
    """A global table read as the stream reads it (each key's value as of an event
    time), its values parsed once per version when they cannot be changed in place."""

    def __init__(self, spec: GlobalSpec, data: dict[str, Versions]) -> None:
        super().__init__(spec)
        self.data = data
        self._parsed: dict[tuple[str, int, int], Any] = {}

    def get(self, key: str, at_ms: int | None = None) -> Any | None:
        chosen: list[Any] | None = None
        for version in self.data.get(key, ()):
            if at_ms is not None and version[0] > at_ms:
                break
            chosen = version
        if chosen is None or chosen[2] is None:
            return None
        cached = (key, chosen[0], chosen[1])
        found = self._parsed.get(cached, _ABSENT)
        if found is not _ABSENT:
            return found
        value = self.spec.value_type.parse(chosen[2].encode("utf-8"), BIG)
        try:
            hash(value)  # unhashable: may be changed in place by a joiner, so not shared
        except TypeError:
            return value
        self._parsed[cached] = value
        return value


def build_global(
    spec: GlobalSpec, records: Iterable[SourceRecord], max_bytes: int
) -> dict[str, Versions]:
    """A global table's versions from its topic's records (each partition in offset
    order), invalid records left out as the workers leave them out."""
    table = MemoryGlobalTable(spec, max_bytes)
    for record in records:
        table.apply(record.key, record.value, record.timestamp, record.offset)
    return table.data
