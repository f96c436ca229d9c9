"""The ceiling of the inventory path: a bare aiokafka consumer that reads and parses the
store events, no framework, no state.

    python -m bench.baselines.aiokafka_parse --bootstrap 127.0.0.1:25092 --topic item-events

Reads every partition of the topic from the beginning to the end offsets it saw at the
start with ``getmany`` and parses each value with ``orjson.loads``, as fast a JSON parser
as the pipelines' own readers. Prints one JSON object:
records, seconds, events_per_s (from the first fetch to the last record) and the
progress series.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition

from core.admin import partitions_of


async def consume_and_parse(bootstrap: str, topic: str) -> dict[str, Any]:
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
        records = parsed = 0
        started: float | None = None
        series: list[tuple[float, int]] = []
        while records < total:
            batches = await consumer.getmany(timeout_ms=1000, max_records=50_000)
            if started is None and batches:
                started = time.monotonic()
            for messages in batches.values():
                for message in messages:
                    if message.value is not None and isinstance(orjson.loads(message.value), dict):
                        parsed += 1
                records += len(messages)
            if started is not None:
                series.append((time.monotonic() - started, records))
        seconds = time.monotonic() - (started or time.monotonic())
        return {
            "records": records,
            "parsed_objects": parsed,
            "seconds": seconds,
            "events_per_s": records / seconds if seconds > 0 else None,
            "series": series[:: max(1, len(series) // 200)],
        }
    finally:
        await consumer.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", default="127.0.0.1:25092")
    parser.add_argument("--topic", default="item-events")
    args = parser.parse_args()
    result = asyncio.run(consume_and_parse(args.bootstrap, args.topic))
    sys.stdout.write(orjson.dumps(result).decode() + "\n")


if __name__ == "__main__":
    main()
