"""The ceiling of word counting: a bare aiokafka consumer, no framework, no state store.

    python -m bench.baselines.aiokafka_wordcount --bootstrap 127.0.0.1:25092

Reads every partition of ``text-lines`` from the beginning to the end offsets it saw at
the start with ``getmany``, decodes and tokenises each line with the project's rule and
counts into a dict. Prints one JSON object: lines, seconds, events_per_s, distinct words
and the progress series.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections import Counter
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition

from agents.words import tokenize_bytes
from core.admin import partitions_of


async def count(bootstrap: str, topic: str) -> dict[str, Any]:
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        max_partition_fetch_bytes=4 * 1024 * 1024,
        fetch_max_bytes=32 * 1024 * 1024,
    )
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in await partitions_of(bootstrap, topic)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        total = sum(ends.values()) - sum((await consumer.beginning_offsets(tps)).values())
        counts: Counter[str] = Counter()
        lines = 0
        started: float | None = None
        series: list[tuple[float, int]] = []
        while lines < total:
            batches = await consumer.getmany(timeout_ms=1000, max_records=50_000)
            if started is None and batches:
                started = time.monotonic()
            for messages in batches.values():
                for message in messages:
                    if message.value is not None:
                        counts.update(tokenize_bytes(message.value))
                lines += len(messages)
            if started is not None:
                series.append((time.monotonic() - started, lines))
        seconds = time.monotonic() - (started or time.monotonic())
        return {
            "lines": lines,
            "seconds": seconds,
            "events_per_s": lines / seconds if seconds > 0 else None,
            "distinct_words": len(counts),
            "series": series[:: max(1, len(series) // 200)],
        }
    finally:
        await consumer.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", default="127.0.0.1:25092")
    parser.add_argument("--topic", default="text-lines")
    args = parser.parse_args()
    result = asyncio.run(count(args.bootstrap, args.topic))
    sys.stdout.write(orjson.dumps(result).decode() + "\n")


if __name__ == "__main__":
    main()
