"""The batch baseline: a bare Spark count of the source topics, with the batch job's own
session (the same Kafka connector jars).

    python -m bench.baselines.spark_scan --bootstrap 127.0.0.1:25092 \
        --topics text-lines,item-events,products --master 'local[*]' [--fetch-max-wait-ms 10]

Without ``--fetch-max-wait-ms`` the reader has Spark's and Kafka's defaults (a bare
count); with it, the fetch wait the batch job's own readers use (``jobs/io.py``).

Prints one JSON object: the records counted and the seconds of the count alone.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from typing import Any

import orjson


def session(master: str) -> Any:
    """The batch job's SparkSession builder (``jobs.session``), so the jars are the same."""
    jobs_session: Any = importlib.import_module("jobs.session")
    return jobs_session.build_session(master)


def count(spark: Any, bootstrap: str, topics: str, fetch_max_wait_ms: int | None = None) -> int:
    reader = spark.read.format("kafka")
    if fetch_max_wait_ms is not None:
        reader = reader.option("kafka.fetch.max.wait.ms", str(fetch_max_wait_ms))
    frame = (
        reader.option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topics)
        .option("startingOffsets", "earliest")
        .option("endingOffsets", "latest")
        .load()
    )
    return int(frame.count())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", default="127.0.0.1:25092")
    parser.add_argument("--topics", default="text-lines,item-events,products,payments")
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--fetch-max-wait-ms", type=int, default=None)
    args = parser.parse_args()
    spark = session(args.master)
    try:
        started = time.monotonic()
        records = count(spark, args.bootstrap, args.topics, args.fetch_max_wait_ms)
        seconds = time.monotonic() - started
    finally:
        spark.stop()
    sys.stdout.write(orjson.dumps({"records": records, "count_s": seconds}).decode() + "\n")


if __name__ == "__main__":
    main()
