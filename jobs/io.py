"""The job's reads and writes: Kafka ranges in, Parquet views and report.json out, and the
corrections that a repair publishes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaProducer
from pyspark.sql import DataFrame, SparkSession

KAFKA_SCHEMA = (
    "key binary, value binary, topic string, partition int, offset long, "
    "timestamp timestamp, timestampType int"
)

#: The topic the workers' corrections agent consumes (see agents/corrections.py).
CORRECTIONS_TOPIC = "corrections"


def read_range(
    spark: SparkSession,
    bootstrap: str,
    topic: str,
    ends: dict[int, int],
    starts: dict[int, int] | None = None,
) -> DataFrame:
    """The committed records of ``topic`` from ``starts`` (default: the earliest) up to
    ``ends``, one Spark partition per Kafka partition, read in parallel."""
    parts = sorted(p for p, end in ends.items() if end > (starts or {}).get(p, 0))
    if not parts:
        return spark.createDataFrame([], KAFKA_SCHEMA)
    begin = {str(p): (starts or {}).get(p, -2) for p in parts}
    return (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("assign", json.dumps({topic: parts}))
        .option("startingOffsets", json.dumps({topic: begin}))
        .option("endingOffsets", json.dumps({topic: {str(p): ends[p] for p in parts}}))
        # Changelogs are written by transactional producers under exactly_once.
        .option("kafka.isolation.level", "read_committed")
        # Compaction and retention leave offset gaps; they are not data loss here.
        .option("failOnDataLoss", "false")
        .load()
    )


def write_view(view: DataFrame, out: Path, name: str) -> DataFrame:
    """Write a batch view as Parquet under ``out/name`` and return it read back, so that
    the recompute runs once however often the view is used afterwards."""
    path = str(out / name)
    view.write.mode("overwrite").parquet(path)
    return view.sparkSession.read.parquet(path)


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
    """Send (key, value) records to ``corrections``; the key is the table's raw key, so a
    record lands in the partition whose worker owns that key. Returns how many."""
    return asyncio.run(_publish(bootstrap, records))
