"""The global tables as of the cut, read by the driver from their topics.

A global table is small enough for every worker to keep whole, so the driver reads its
topic up to the cut with a plain consumer (each partition in offset order, as a worker's
table reads it) while the Spark session starts, and the job broadcasts it to the
executors. Invalid records are left out, as the workers leave them out.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from aiokafka import AIOKafkaConsumer, TopicPartition

from jobs.replay import Rec, build_global
from tables.global_table import GlobalSpec, Versions

Offsets = Mapping[str, Mapping[int, int]]


async def read_global_tables(
    bootstrap: str,
    specs: Mapping[str, GlobalSpec],
    ends: Offsets,
    max_bytes: int,
    timeout_s: float = 300.0,
) -> dict[str, dict[str, Versions]]:
    """Each global table's versions from its topic's records below ``ends``."""
    found: dict[str, dict[str, Versions]] = {}
    for name, spec in specs.items():
        records = await _records(bootstrap, spec.topic, ends.get(spec.topic, {}), timeout_s)
        found[name] = build_global(spec, records, max_bytes)
    return found


async def _records(
    bootstrap: str, topic: str, ends: Mapping[int, int], timeout_s: float
) -> list[Rec]:
    wanted = {TopicPartition(topic, p): end for p, end in ends.items() if end > 0}
    if not wanted:
        return []
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        isolation_level="read_committed",
    )
    await consumer.start()
    try:
        consumer.assign(list(wanted))
        await consumer.seek_to_beginning(*wanted)
        by_partition: dict[int, list[Rec]] = {tp.partition: [] for tp in wanted}
        deadline = time.monotonic() + timeout_s
        pending = dict(wanted)
        while pending:
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {topic} did not reach the cut in {timeout_s:.0f}s")
            batches = await consumer.getmany(*pending, timeout_ms=200, max_records=10_000)
            for tp, messages in batches.items():
                by_partition[tp.partition] += [
                    Rec(topic, tp.partition, m.offset, m.key, m.value, m.timestamp)
                    for m in messages
                    if m.offset < wanted[tp]
                ]
            for tp in list(pending):
                if await consumer.position(tp) >= wanted[tp]:
                    del pending[tp]
        return [r for partition in sorted(by_partition) for r in by_partition[partition]]
    finally:
        await consumer.stop()
