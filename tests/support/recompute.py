"""The nightly recompute's task code run in process, and tables compared as the job does.

:func:`recompute_log` hands the records of a :class:`streams.testing.TestDriver`'s log to
the very functions the job's Spark tasks run (``jobs.tasks``: source tasks fed Arrow
batches, stage tasks fed each partition's repartition records), without Spark, so the
unit tests check the replay against the engine in milliseconds; the batch tests run the
same through Spark.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import orjson
import pyarrow as pa

from jobs.compare import same_value
from jobs.declared import Declared, JobSpec, declare
from jobs.replay import build_global
from jobs.rows import OUTPUT_SCHEMA
from jobs.tasks import SourceTask, replay_stage
from streams.testing import TestDriver
from tables.engine import TP
from tables.pipeline import Record

Tables = dict[str, dict[Any, Any]]

SOURCE_SCHEMA = pa.schema(
    [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", pa.int64()),
    ]
)


def job_spec(driver: TestDriver, modules: Iterable[str] = ()) -> JobSpec:
    """The job's spec for a driver's pipelines, its clock the driver's."""
    context = driver.context
    return JobSpec(
        tuple(modules),
        driver.partitions,
        context.max_event_bytes,
        context.window_retention_ms,
        context.app_id,
        driver.now_ms,
    )


def arrow(records: Sequence[Any]) -> pa.RecordBatch:
    """Records as the source stage's Arrow batch (``timestamp`` in ms)."""
    return pa.RecordBatch.from_pylist(
        [
            {
                "key": r.key,
                "value": r.value,
                "topic": r.topic,
                "partition": r.partition,
                "offset": r.offset,
                "timestamp": r.timestamp,
            }
            for r in records
        ],
        schema=SOURCE_SCHEMA,
    )


def recompute_log(
    declared: Declared, log: Mapping[TP, list[Record]], *, batch_rows: int = 700, chunks: int = 3
) -> pa.Table:
    """The job's output rows for the records of ``log`` (see the module's docstring): each
    partition's ordered topics in one source task, one topic after another, in Arrow
    batches of ``batch_rows``; the topics only chunk pipelines read split in ``chunks``."""
    plan = declared.plan
    partitions = declared.spec.partitions
    for name, spec in plan.globals.items():
        records = [r for tp, rs in sorted(log.items()) if tp.topic == spec.topic for r in rs]
        declared.globals[name].data = build_global(spec, records, declared.spec.max_event_bytes)
    outputs: list[pa.RecordBatch] = []
    ordered = sorted(plan.sources - plan.split_topics)
    empty = {
        p: frozenset(t for t in plan.sources if not log.get(TP(t, p))) for p in range(partitions)
    }
    for partition in range(partitions):
        records = [r for topic in ordered for r in log.get(TP(topic, partition), [])]
        outputs += _source_task(declared, records, batch_rows, empty)
        for topic in sorted(plan.split_topics):
            found = log.get(TP(topic, partition), [])
            size = max(1, -(-len(found) // chunks))
            for start in range(0, len(found), size):
                outputs += _source_task(declared, found[start : start + size], batch_rows, empty)
    for stage in plan.stages[1:]:
        sent = pa.Table.from_batches(outputs, schema=OUTPUT_SCHEMA).to_pylist()
        wanted = [row for row in sent if row["kind"] == "topic" and row["name"] in stage.reads]
        for partition in sorted({row["partition"] for row in wanted}):
            rows = [row for row in wanted if row["partition"] == partition]
            table = pa.Table.from_pylist(rows, schema=OUTPUT_SCHEMA)
            outputs += list(replay_stage(declared, stage.number, table))
    return pa.Table.from_batches(outputs, schema=OUTPUT_SCHEMA)


def _source_task(
    declared: Declared,
    records: list[Record],
    rows: int,
    empty: Mapping[int, frozenset[str]] | None = None,
) -> list[pa.RecordBatch]:
    task = SourceTask(declared, empty)
    for start in range(0, len(records), rows):
        task.feed(arrow(records[start : start + rows]))
    return list(task.finish())


def recomputed_tables(declared: Declared, output: pa.Table) -> Tables:
    """The recomputed tables as :meth:`TestDriver.table` gives a table."""
    found: Tables = {name: {} for name in declared.plan.tables}
    for row in output.to_pylist():
        if row["kind"] != "table":
            continue
        key = row["key"] if row["window_start"] is None else (row["key"], row["window_start"])
        found[row["name"]][key] = orjson.loads(row["value"])
    return found


def replayed(driver: TestDriver, modules: Iterable[str], **options: Any) -> Tables:
    """The pipeline modules a driver runs, recomputed from its log by the job's tasks
    (loaded anew with the job's context, its clock the driver's)."""
    declared = declare(job_spec(driver, modules))
    return recomputed_tables(declared, recompute_log(declared, driver.log.records, **options))


def driver_tables(driver: TestDriver, names: Iterable[str]) -> Tables:
    return {name: driver.table(name) for name in names}


def differing(a: Tables, b: Tables) -> dict[str, list[Any]]:
    """Per table, the keys whose values differ (numbers within the job's tolerance)."""
    found: dict[str, list[Any]] = {}
    for name in sorted(set(a) | set(b)):
        left, right = a.get(name, {}), b.get(name, {})
        keys = [
            k
            for k in sorted(set(left) | set(right), key=repr)
            if k not in left or k not in right or not same_value(left[k], right[k])
        ]
        if keys:
            found[name] = keys
    return found
