"""The recompute as Spark jobs: the stages (``jobs/plans.py``), the global tables read by
the driver broadcast to them.

Stage 0 reads the source topics up to the cut. The topics that some pipeline must see
in offset order are read one partition number at a time, every such topic's partition
in one Spark partition (``coalesce(1)`` of one read: no shuffle), so that one task
replays every pipeline of that partition, each topic in offset order, parsing each
record once for all of them. A topic read only by pipelines that may run on any chunk is
read on its own, its partitions split into as many ranges as the executors have cores
(``minPartitions``). Each later stage gets what the earlier ones sent to its topics,
grouped by partition (a shuffle of a few combined records per sender and partition).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import reduce
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as sf

from jobs import io as kio
from jobs.cut import Cut
from jobs.declared import Declared, GlobalData, on_executor
from jobs.rows import OUTPUT_DDL, OUTPUT_SCHEMA
from jobs.tasks import replay_stage, source_task, stage_task


@dataclass
class Recomputation:
    """The stages' rows: the recomputed tables' rows (:data:`jobs.rows.ROW_SCHEMA`, cached
    in as many partitions as the executors have cores: the stages' outputs are mostly
    repartition records, the tables a fraction of them) and what the replays counted.

    When stage 0 gave few rows (``local_rows``), the driver collects them and runs the
    later stages itself: ``local`` holds the tables' rows as Arrow and ``tables`` is made
    from them only when a Spark job needs it (:meth:`frame`)."""

    tables: DataFrame | None
    frames: list[DataFrame] = field(default_factory=list)
    figures: dict[str, int] = field(default_factory=dict)
    globals: dict[str, int] = field(default_factory=dict)
    local: pa.Table | None = None

    def frame(self, spark: SparkSession) -> DataFrame:
        """The tables' rows as a DataFrame."""
        if self.tables is None:
            assert self.local is not None
            self.tables = spark.createDataFrame(self.local).persist()
        return self.tables

    def unpersist(self) -> None:
        for frame in (self.tables, *self.frames):
            if frame is not None:
                frame.unpersist()


def _source_columns(frame: DataFrame) -> DataFrame:
    return frame.select(
        "key",
        "value",
        "topic",
        "partition",
        "offset",
        sf.unix_millis("timestamp").alias("timestamp"),
    )


def empty_partitions(cut: Cut, declared: Declared) -> dict[int, frozenset[str]]:
    """Per partition number, the source topics whose partition holds no record at the
    cut (its end is its start)."""
    found: dict[int, frozenset[str]] = {}
    for partition in range(declared.spec.partitions):
        found[partition] = frozenset(
            topic
            for topic in declared.plan.sources
            if cut.sources.get(topic, {}).get(partition, 0)
            <= cut.log_start.get(topic, {}).get(partition, 0)
        )
    return found


Ends = dict[str, dict[int, int]]


@dataclass
class SourceReads:
    """The reads of stage 0: one per partition number whose ordered topics (two or
    more) hold records, to be coalesced into one Spark partition; one of the partitions
    where a single ordered topic holds records (each its own Spark partition); one of
    the topics that may be read in chunks."""

    coalesced: list[Ends] = field(default_factory=list)
    alone: Ends = field(default_factory=dict)
    chunks: Ends = field(default_factory=dict)


def source_reads(cut: Cut, declared: Declared) -> SourceReads:
    """What stage 0 reads, grouped as :class:`SourceReads` says (a read costs the driver
    a few seconds of planning with a cold JVM, so partitions share one where they can)."""
    plan = declared.plan
    split = plan.split_topics
    reads = SourceReads()
    for partition in range(declared.spec.partitions):
        ends = {
            topic: {partition: cut.sources[topic][partition]}
            for topic in sorted(plan.sources - split)
            if cut.sources.get(topic, {}).get(partition, 0) > 0
        }
        if len(ends) == 1:
            [(topic, end)] = ends.items()
            reads.alone.setdefault(topic, {}).update(end)
        elif ends:
            reads.coalesced.append(ends)
    reads.chunks = {topic: cut.sources[topic] for topic in sorted(split) if cut.sources.get(topic)}
    return reads


def source_frame(
    spark: SparkSession, bootstrap: str, cut: Cut, declared: Declared
) -> DataFrame | None:
    """Stage 0's records (see the module's docstring); None when there are none."""
    reads = source_reads(cut, declared)
    # Spark 4 gives a union of inputs that all have one partition one partition in all
    # (its output partitioning is theirs): the coalesced reads must stay one task each.
    spark.conf.set(UNION_PARTITIONING, "false")
    frames = [
        _source_columns(kio.read_ranges(spark, bootstrap, ends)).coalesce(1)
        for ends in reads.coalesced
    ]
    if reads.alone:
        frames.append(_source_columns(kio.read_ranges(spark, bootstrap, reads.alone)))
    if reads.chunks:
        cores = spark.sparkContext.defaultParallelism
        read = kio.read_ranges(spark, bootstrap, reads.chunks, min_partitions=2 * cores)
        frames.append(_source_columns(read))
    if not frames:
        return None
    return reduce(DataFrame.union, frames)


#: Spark's setting that makes a union keep its inputs' common output partitioning.
UNION_PARTITIONING = "spark.sql.unionOutputPartitioning"
#: Stage 0's rows up to which the driver collects them and runs the later stages, the
#: compare and the views itself (``--local-rows``): each later Spark job costs a second or
#: more of scheduling and cold code paths, whatever its size.
LOCAL_ROWS = 200_000
#: The columns of a table row (:data:`jobs.rows.ROW_SCHEMA`).
ROW_COLUMNS = ("table", "partition", "raw_key", "key", "window_start", "window_end", "value")


def recompute(
    spark: SparkSession,
    bootstrap: str,
    cut: Cut,
    declared: Declared,
    global_data: GlobalData,
    say: Callable[[str], None],
    local_rows: int = LOCAL_ROWS,
) -> Recomputation:
    """Run every stage; the result's rows are cached (or held by the driver)."""
    plan = declared.plan
    shared = spark.sparkContext.broadcast(dict(global_data))
    spec = declared.spec
    frames: list[DataFrame] = []
    sources = source_frame(spark, bootstrap, cut, declared)
    task = source_task(spec, shared, empty_partitions(cut, declared))
    if sources is None:
        stage0 = spark.createDataFrame([], OUTPUT_DDL)
    else:
        stage0 = sources.mapInArrow(task, OUTPUT_DDL)
    frames.append(stage0.persist())
    started = time.monotonic()
    count = frames[0].count()
    say(f"stage 0: {', '.join(plan.stages[0].pipelines) if plan.stages else 'nothing'} "
        f"({count} rows, {time.monotonic() - started:.1f}s)")  # fmt: skip
    sizes = {n: len(d) for n, d in global_data.items()}
    if count <= local_rows:
        rows = frames[0].toArrow().cast(OUTPUT_SCHEMA)
        frames[0].unpersist()
        found = later_stages(on_executor(spec, dict(global_data)), rows, say)
        return Recomputation(None, [], figures_of(found), sizes, tables_of(found))
    for stage in plan.stages[1:]:
        sent = reduce(DataFrame.union, frames).where(
            (sf.col("kind") == "topic") & sf.col("name").isin(sorted(stage.reads))
        )
        out = sent.groupBy("partition").applyInArrow(
            stage_task(spec, shared, stage.number), OUTPUT_DDL
        )
        frames.append(out.persist())
        started = time.monotonic()
        count = frames[-1].count()
        say(f"stage {stage.number}: {', '.join(stage.pipelines)} ({count} rows, "
            f"{time.monotonic() - started:.1f}s)")  # fmt: skip
    rows = reduce(DataFrame.union, frames).where(sf.col("kind") != "topic")
    figures: dict[str, int] = {}
    for row in (
        rows.where(sf.col("kind") == "figure")
        .groupBy("name")
        .agg(sf.sum("seq").alias("n"))
        .collect()
    ):
        figures[row["name"]] = int(row["n"])
    tables = (
        rows.where(sf.col("kind") == "table")
        .select("name", "partition", "raw_key", "key", "window_start", "window_end", "value")
        .withColumnRenamed("name", "table")
        .coalesce(spark.sparkContext.defaultParallelism)
        .persist()
    )
    return Recomputation(tables, frames, figures, sizes)


def later_stages(declared: Declared, rows: pa.Table, say: Callable[[str], None]) -> pa.Table:
    """The stages after stage 0 run by the driver on stage 0's rows (``rows``, as
    :data:`jobs.rows.OUTPUT_SCHEMA`), as their Spark tasks run them: each stage on what
    the earlier ones sent to its topics, one partition at a time. Returns every stage's
    rows."""
    found = [rows]
    for stage in declared.plan.stages[1:]:
        started = time.monotonic()
        sent = pa.concat_tables(found)
        sent = sent.filter(
            pc.and_(
                pc.equal(sent.column("kind"), "topic"),
                pc.is_in(sent.column("name"), pa.array(sorted(stage.reads), pa.string())),
            )
        )
        batches: list[pa.RecordBatch] = []
        for partition in pc.unique(sent.column("partition")).to_pylist():
            mine = sent.filter(pc.equal(sent.column("partition"), partition))
            batches.extend(replay_stage(declared, stage.number, mine))
        out = pa.Table.from_batches(batches, schema=OUTPUT_SCHEMA)
        found.append(out)
        say(f"stage {stage.number}: {', '.join(stage.pipelines)} ({out.num_rows} rows, "
            f"{time.monotonic() - started:.1f}s, in the driver)")  # fmt: skip
    return pa.concat_tables(found)


def figures_of(rows: pa.Table) -> dict[str, int]:
    """What the replays counted, summed over their tasks."""
    figures: dict[str, int] = {}
    found = rows.filter(pc.equal(rows.column("kind"), "figure"))
    names, counts = found.column("name").to_pylist(), found.column("seq").to_pylist()
    for name, n in zip(names, counts, strict=True):
        figures[name] = figures.get(name, 0) + int(n)
    return figures


def tables_of(rows: pa.Table) -> pa.Table:
    """The tables' rows (:data:`jobs.rows.ROW_SCHEMA`) among a stage's rows."""
    tables = rows.filter(pc.equal(rows.column("kind"), "table"))
    columns = ["name", *ROW_COLUMNS[1:]]
    return tables.select(columns).rename_columns(list(ROW_COLUMNS))


def write_views(
    result: Recomputation, out: Any, tables: Mapping[str, Any], spark: SparkSession | None = None
) -> dict[str, int]:
    """Each recomputed table as Parquet under ``out/<table>``: ``key``, ``window_start``,
    ``window_end`` (windowed tables), ``value`` (JSON text), ``partition``, ``raw_key``.
    Returns the keys recomputed per table. Rows the driver holds are written by the
    driver when ``out`` is a local directory."""
    if result.local is not None and kio.local_path(out) is not None:
        return _write_local_views(result.local, out, tables)
    if result.tables is not None:
        rows = result.tables
    else:
        assert spark is not None, "rows the driver holds need the session to be written"
        rows = result.frame(spark)
    counts = {row["table"]: int(row["count"]) for row in rows.groupBy("table").count().collect()}

    def write(name: str) -> None:
        columns: list[Any] = ["key"]
        if tables[name].window is not None:
            columns += ["window_start", "window_end"]
        columns += [sf.col("value").cast("string").alias("value"), "partition", "raw_key"]
        kio.write_view(rows.where(sf.col("table") == name).select(*columns), out, name)

    # Small jobs, each mostly waiting for its tasks to be scheduled: written at once.
    with ThreadPoolExecutor(max_workers=4, thread_name_prefix="views") as pool:
        list(pool.map(write, tables))
    return {name: counts.get(name, 0) for name in tables}


def _write_local_views(rows: pa.Table, out: Any, tables: Mapping[str, Any]) -> dict[str, int]:
    """:func:`write_views` of rows the driver holds, written by the driver."""
    counts: dict[str, int] = {}
    for name, spec in tables.items():
        mine = rows.filter(pc.equal(rows.column("table"), name))
        columns = ["key", *(("window_start", "window_end") if spec.window is not None else ())]
        view = mine.select(columns)
        view = view.append_column("value", kio.as_text(mine.column("value")))
        view = view.append_column("partition", mine.column("partition"))
        view = view.append_column("raw_key", mine.column("raw_key"))
        kio.write_local_view(view, out, name)
        counts[name] = mine.num_rows
    return counts
