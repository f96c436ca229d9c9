"""The live tables at the cut, read from their changelogs.

A table's changelog (``<app_id>-<table>-changelog``) holds every value a worker wrote,
keyed by the table key; its latest record of a key at the cut is the key's live value
(a null value: deleted). The key under which a table partition keeps its position in
the sources (``core.topics.POSITION_KEY``) is no table key. The latest values are found
in one aggregation over all the changelogs; their keys are then read as table keys
(a windowed table's window keys as their key and window) in Python.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as sf

from core.topics import POSITION_KEY
from jobs import io as kio
from jobs.cut import Cut
from jobs.replay import table_row
from jobs.rows import ROW_DDL, ROW_SCHEMA
from tables.pipeline import TableSpec
from tables.windows import AnyWindow


def changelog_topic(app_id: str, table: str) -> str:
    return f"{app_id}-{table}-changelog"


def latest(changelogs: DataFrame) -> DataFrame:
    """The latest value of each key of each changelog partition: ``topic``,
    ``partition``, ``key``, ``value`` (deleted keys and positions left out)."""
    keys = changelogs.where(sf.col("key") != sf.lit(bytearray(POSITION_KEY)))
    newest = keys.groupBy("topic", "partition", "key").agg(
        sf.max_by(sf.struct("value"), sf.col("offset")).alias("last")
    )
    return newest.where(sf.col("last.value").isNotNull()).select(
        "topic", "partition", "key", sf.col("last.value").alias("value")
    )


def _decode(
    tables: Mapping[str, tuple[str, AnyWindow | None]],
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The task that reads changelog keys as table rows (``tables``: changelog topic ->
    (table, window))."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        specs = {topic: TableSpec(name, window=window) for topic, (name, window) in tables.items()}
        for batch in batches:
            rows = [
                table_row(specs[topic], partition, key, value)
                for topic, partition, key, value in zip(
                    batch.column("topic").to_pylist(),
                    batch.column("partition").to_pylist(),
                    batch.column("key").to_pylist(),
                    batch.column("value").to_pylist(),
                    strict=True,
                )
            ]
            yield pa.RecordBatch.from_pylist([row._asdict() for row in rows], schema=ROW_SCHEMA)

    return run


def live_tables(
    spark: SparkSession,
    bootstrap: str,
    cut: Cut,
    app_id: str,
    specs: Mapping[str, TableSpec],
) -> DataFrame | None:
    """The rows (:data:`jobs.rows.ROW_SCHEMA`) of every table in ``specs`` at the cut;
    None when no changelog holds a record (no table has been written yet)."""
    topics = {changelog_topic(app_id, name): (name, spec.window) for name, spec in specs.items()}
    ends = {topic: cut.changelogs.get(topic, {}) for topic in topics}
    if not any(end > 0 for parts in ends.values() for end in parts.values()):
        return None
    records = kio.read_ranges(spark, bootstrap, ends)
    return latest(records).mapInArrow(_decode(topics), ROW_DDL)
