"""What the job's Spark tasks run: records in as Arrow batches, replayed pipelines, rows
out as Arrow batches. Executed by the executors' Python workers (mapInArrow and
applyInArrow), so it imports no Spark and nothing of the worker.

A **source task** reads one partition number of the ordered source topics (every topic
some pipeline must see in offset order: each topic's records in offset order, one topic
after another), or a run of one partition of a topic read only by pipelines that may
run on any chunk; it replays the pipelines of stage 0 that read those topics, one
Arrow batch per cycle. A **stage task** gets everything the previous stages sent to one
partition of their topics (repartition records) and replays the stage's pipelines on it.
Either emits:

* ``table`` rows: the final contents of the compared tables it wrote;
* ``topic`` rows: what it sent to topics later stages read, with the partition each
  record goes to and its place in the sender's order (``source``, ``source_offset``,
  ``seq``);
* ``figure`` rows: what it counted (``seq`` holds the number).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from itertools import pairwise
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from core.topics import partition_for
from jobs.declared import Declared, JobSpec, on_executor
from jobs.plans import plan_of, silent_with
from jobs.replay import DeferredJoinRunner, PartitionReplay, Process, Rec, TableRow
from jobs.rows import OUTPUT_SCHEMA
from tables.pipeline import RecordColumns

#: Records per cycle of a stage task (a source task's cycle is one Arrow batch).
CYCLE_RECORDS = 10_000
#: Rows per output batch.
OUTPUT_ROWS = 50_000

#: The columns a source task reads (``timestamp`` in ms).
SOURCE_COLUMNS = ("key", "value", "topic", "partition", "offset", "timestamp")

ArrowTask = Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]


class OrderError(RuntimeError):
    """Records of a partition reached a task out of offset order."""


def processes(declared: Declared, names: Iterable[str]) -> dict[str, Process]:
    """A fresh batch function per API pipeline (its joins keep state per partition)."""
    found: dict[str, Process] = {}
    for name in names:
        plan = plan_of(declared.plan.pipelines[name])
        if plan is not None:
            found[name] = DeferredJoinRunner(plan)
    return found


def new_replay(
    declared: Declared,
    stage: int,
    partition: int,
    topic: str,
    empty: frozenset[str] = frozenset(),
) -> PartitionReplay:
    """The replay of a task whose first record is of ``topic``; ``empty``: the source
    topics whose partition holds no record at the cut (a pipeline that can produce
    nothing without them does not run)."""
    plan = declared.plan
    names = plan.stages[stage].pipelines
    if stage == 0:
        split = plan.split_topics
        group = {topic} if topic in split else plan.sources - split
        names = tuple(
            n
            for n in names
            if group & set(plan.pipelines[n].reads) and not silent_with(plan.pipelines[n], empty)
        )
    return PartitionReplay(
        partition,
        [plan.pipelines[name] for name in names],
        keep=plan.internal,
        processes=processes(declared, names),
    )


class SourceTask:
    """One source task (see the module's docstring). ``empty``: per partition, the
    source topics that hold no record there at the cut."""

    def __init__(
        self, declared: Declared, empty: Mapping[int, frozenset[str]] | None = None
    ) -> None:
        self.declared = declared
        self.empty = empty or {}
        self.replay: PartitionReplay | None = None
        self.last: dict[str, int] = {}
        self.first_offset = -1

    def feed(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        topics = batch.column("topic")
        if pc.count_distinct(topics).as_py() == 1:
            self._run(batch)
            return
        changes = pc.not_equal(topics.slice(1), topics.slice(0, len(topics) - 1))
        starts = [0, *(i + 1 for i in pc.indices_nonzero(changes).to_pylist()), batch.num_rows]
        for begin, end in pairwise(starts):
            self._run(batch.slice(begin, end - begin))

    def _run(self, batch: pa.RecordBatch) -> None:
        topic = batch.column("topic")[0].as_py()
        partitions = batch.column("partition")
        partition = partitions[0].as_py()
        offsets = batch.column("offset")
        if self.replay is None:
            self.replay = new_replay(
                self.declared, 0, partition, topic, self.empty.get(partition, frozenset())
            )
            self.first_offset = offsets[0].as_py()
        elif partition != self.replay.partition or pc.count_distinct(partitions).as_py() != 1:
            raise OrderError(f"a source task got partitions {self.replay.partition} and others")
        self._check_order(topic, partition, offsets)
        # Held as columns: the pipelines parse and check them a column at a time, and
        # a record is built only where one is asked for (a dead letter, a replay).
        records = RecordColumns(
            topic,
            partition,
            offsets.to_pylist(),
            batch.column("key").to_pylist(),
            batch.column("value").to_pylist(),
            batch.column("timestamp").to_pylist(),
            Rec,
        )
        self.replay.cycle({topic: records})

    def _check_order(self, topic: str, partition: int, offsets: pa.Array) -> None:
        """Offsets must grow: the pipelines see each partition in offset order or not at
        all (a check that costs one comparison per record, in Arrow)."""
        first = offsets[0].as_py()
        growing = (
            len(offsets) < 2
            or pc.all(pc.greater(offsets.slice(1), offsets.slice(0, len(offsets) - 1))).as_py()
        )
        if not growing or first <= self.last.get(topic, -1):
            raise OrderError(f"records of {topic}[{partition}] arrived out of offset order")
        self.last[topic] = offsets[-1].as_py()

    def finish(self) -> Iterator[pa.RecordBatch]:
        if self.replay is None:
            return iter(())
        self.replay.finish()
        return results(self.declared, self.replay, self.first_offset)


def source_task(
    spec: JobSpec, global_data: Any, empty: Mapping[int, frozenset[str]] | None = None
) -> ArrowTask:
    """The function of the source stage's mapInArrow (``empty``: see :class:`SourceTask`)."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        task = SourceTask(on_executor(spec, global_data), empty)
        for batch in batches:
            task.feed(batch)
        yield from task.finish()

    return run


def stage_task(spec: JobSpec, global_data: Any, stage: int) -> Callable[[pa.Table], pa.Table]:
    """The function of a later stage's applyInArrow, grouped by partition."""

    def run(table: pa.Table) -> pa.Table:
        declared = on_executor(spec, global_data)
        batches = list(replay_stage(declared, stage, table))
        return pa.Table.from_batches(batches, schema=OUTPUT_SCHEMA)

    return run


def replay_stage(declared: Declared, stage: int, table: pa.Table) -> Iterator[pa.RecordBatch]:
    """Replay a later stage on everything sent to one partition (``table``: ``topic``
    rows), each topic's records in their senders' order."""
    if table.num_rows == 0:
        return iter(())
    table = table.sort_by(
        [("name", "ascending"), ("source", "ascending"), ("source_offset", "ascending"),
         ("seq", "ascending")]
    )  # fmt: skip
    partition = table.column("partition")[0].as_py()
    topics = table.column("name").to_pylist()
    keys = table.column("raw_key").to_pylist()
    values = table.column("value").to_pylist()
    stamps = table.column("timestamp").to_pylist()
    replay = new_replay(declared, stage, partition, topics[0])
    begin = 0
    while begin < len(topics):
        topic = topics[begin]
        end = begin
        while end < len(topics) and topics[end] == topic and end - begin < CYCLE_RECORDS:
            end += 1
        records = [
            Rec(topic, partition, n, keys[n], values[n], stamps[n] or 0) for n in range(begin, end)
        ]
        replay.cycle({topic: records})
        begin = end
    replay.finish()
    return results(declared, replay, 0)


# -- what a task emits ---------------------------------------------------------------------


def results(
    declared: Declared, replay: PartitionReplay, first_offset: int
) -> Iterator[pa.RecordBatch]:
    """A task's table, topic and figure rows."""
    columns: list[list[Any]] = [[] for _ in OUTPUT_SCHEMA.names]
    partitions = declared.spec.partitions
    source = replay.partition
    for seq, out in enumerate(replay.outputs):
        if out.partition is not None:
            target = out.partition
        elif out.key is not None:
            target = partition_for(out.key, partitions)
        else:
            target = seq % partitions
        _append(columns, ("topic", out.topic, target, out.key, None, None, None, out.value,
                          out.timestamp_ms, source, first_offset, seq))  # fmt: skip
        if len(columns[0]) >= OUTPUT_ROWS:
            yield _batch(columns)
            columns = [[] for _ in OUTPUT_SCHEMA.names]
    for row in replay.table_rows(name for name in declared.plan.tables if name in replay.specs):
        _append(columns, _table_row(row))
        if len(columns[0]) >= OUTPUT_ROWS:
            yield _batch(columns)
            columns = [[] for _ in OUTPUT_SCHEMA.names]
    figures = replay.figures
    for prefix, counts in (
        ("records", figures.records),
        ("dead_letters", figures.dead_letters),
        ("failed", figures.failed),
        ("steps", figures.steps),
    ):
        for name, count in counts.items():
            _append(columns, ("figure", f"{prefix}:{name}", source, None, None, None, None,
                              None, None, source, first_offset, count))  # fmt: skip
    if columns[0]:
        yield _batch(columns)


def _table_row(row: TableRow) -> tuple[Any, ...]:
    return (
        "table", row.table, row.partition, row.raw_key, row.key, row.window_start,
        row.window_end, row.value, None, row.partition, 0, 0,
    )  # fmt: skip


def _append(columns: list[list[Any]], row: Sequence[Any]) -> None:
    for column, value in zip(columns, row, strict=True):
        column.append(value)


def _batch(columns: list[list[Any]]) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(
        [pa.array(column, type=f.type) for column, f in zip(columns, OUTPUT_SCHEMA, strict=True)],
        schema=OUTPUT_SCHEMA,
    )
