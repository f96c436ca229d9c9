"""The job's reads and writes: Kafka ranges in, Parquet views and report.json out, and the
corrections that a repair publishes."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
from aiokafka import AIOKafkaProducer
from pyspark.sql import DataFrame, SparkSession

from jobs.corrections import CORRECTIONS_TOPIC

KAFKA_SCHEMA = (
    "key binary, value binary, topic string, partition int, offset long, "
    "timestamp timestamp, timestampType int"
)

#: How long the broker may hold a fetch of the job's readers (the Kafka default is 500 ms).
#: Every Spark task opens its own consumer, and the broker held about one fetch of each
#: for the whole default: 2.4 s to read 22 records from 7 partitions, 0.33 s at 10 ms;
#: a count of the bench's 10,000,000 records over 32 partitions, 12.7 s against 7.8 s
#: (warm JVM, measured). The job reads closed ranges, so a short wait costs nothing.
FETCH_MAX_WAIT_MS = 10


def read_range(
    spark: SparkSession,
    bootstrap: str,
    topic: str,
    ends: dict[int, int],
    starts: dict[int, int] | None = None,
) -> DataFrame:
    """The committed records of ``topic`` from ``starts`` (default: the earliest) up to
    ``ends``, one Spark partition per Kafka partition, read in parallel."""
    return read_ranges(spark, bootstrap, {topic: ends}, {topic: starts or {}})


def read_ranges(
    spark: SparkSession,
    bootstrap: str,
    ends: dict[str, dict[int, int]],
    starts: dict[str, dict[int, int]] | None = None,
    min_partitions: int | None = None,
) -> DataFrame:
    """The committed records of several topics (``ends``: topic -> partition -> end
    offset) in one read: one resolution of the offsets and one Spark job for all, one
    Spark partition per Kafka partition (``min_partitions``: at least that many, a
    partition's offsets split into ranges). ``topic`` tells the records apart; each
    Spark partition holds its records in offset order."""
    starts = starts or {}
    parts = {
        topic: sorted(p for p, end in by_partition.items() if end > starts.get(topic, {}).get(p, 0))
        for topic, by_partition in ends.items()
    }
    parts = {topic: found for topic, found in parts.items() if found}
    if not parts:
        return spark.createDataFrame([], KAFKA_SCHEMA)
    begin = {t: {str(p): starts.get(t, {}).get(p, -2) for p in ps} for t, ps in parts.items()}
    end = {t: {str(p): ends[t][p] for p in ps} for t, ps in parts.items()}
    reader = spark.read.format("kafka")
    if min_partitions is not None:
        reader = reader.option("minPartitions", str(min_partitions))
    return (
        reader.option("kafka.bootstrap.servers", bootstrap)
        .option("assign", json.dumps(parts))
        .option("startingOffsets", json.dumps(begin))
        .option("endingOffsets", json.dumps(end))
        # Changelogs are written by transactional producers under exactly_once.
        .option("kafka.isolation.level", "read_committed")
        .option("kafka.fetch.max.wait.ms", str(FETCH_MAX_WAIT_MS))
        # Compaction and retention leave offset gaps; they are not data loss here.
        .option("failOnDataLoss", "false")
        .load()
    )


def write_view(view: DataFrame, out: Path | str, name: str) -> None:
    """Write a batch view as Parquet under ``out/name``. ``out`` is a local directory or
    a URI Spark writes to (``hdfs://``, ``s3a://``, ...): the executors write the files,
    so on a cluster it must be a place they and the driver share."""
    view.write.mode("overwrite").parquet(f"{str(out).rstrip('/')}/{name}")


def local_path(out: Path | str) -> Path | None:
    """The local directory ``out`` names (a path, or a ``file:`` URI), else None."""
    if isinstance(out, Path):
        return out
    parts = urlsplit(out)
    if parts.scheme == "file":
        return Path(parts.path)
    return Path(out) if not parts.scheme else None


def as_text(values: pa.ChunkedArray) -> pa.ChunkedArray:
    """Binary values as text, as Spark casts them (bytes that are no UTF-8 replaced)."""
    try:
        return values.cast(pa.string())
    except pa.ArrowInvalid:
        text = [None if v is None else v.decode("utf-8", "replace") for v in values.to_pylist()]
        return pa.chunked_array([pa.array(text, pa.string())])


def write_local_view(view: pa.Table, out: Path | str, name: str) -> None:
    """:func:`write_view` of rows the driver holds, to a local directory: the view's
    folder replaced by one Parquet file (Spark reads it as it reads its own)."""
    local = local_path(out)
    assert local is not None
    folder = local / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    pq.write_table(view, folder / "part-00000.parquet")
    (folder / "_SUCCESS").touch()


def write_report(out: Path, report: dict[str, Any]) -> Path:
    path = out / "report.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))
    tmp.replace(path)
    return path


async def _publish(bootstrap: str, records: Iterable[tuple[bytes, bytes]]) -> int:
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, linger_ms=20
    )
    await producer.start()
    sent = 0
    try:
        pending = []
        for key, value in records:
            pending.append(await producer.send(CORRECTIONS_TOPIC, value, key=key))
            sent += 1
            if len(pending) >= 10_000:
                await asyncio.gather(*pending)
                pending.clear()
        await asyncio.gather(*pending)
    finally:
        await producer.stop()
    return sent


def publish_corrections(bootstrap: str, records: Iterable[tuple[bytes, bytes]]) -> int:
    """Send (key, value) records to ``corrections`` (``jobs/corrections.py``): keyed by
    the key the table is partitioned by, a record lands in the partition whose worker
    owns that key. Returns how many."""
    return asyncio.run(_publish(bootstrap, records))
