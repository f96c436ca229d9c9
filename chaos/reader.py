"""Incremental reads of whole topics: each call reads from where the last one stopped.

Source topics grow by millions of records in a full run; reading them again from the
start at every comparison would grow quadratically. A :class:`TopicReader` remembers the
next offset of each partition and hands each fetched run of records to a callback, in
offset order per partition, up to the end offsets of the moment it was called
(``read_committed``: aborted transactions never show).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from core.admin import partitions_of

#: Called with (partition, records) for each run of fetched records, in offset order.
Handler = Callable[[int, Sequence[Any]], None]


class TopicReader:
    """Reads one topic incrementally; ``next`` is the next offset of each partition."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.next: dict[int, int] = {}
        self.records = 0

    def read_new(self, handle: Handler, timeout: float = 300.0) -> int:
        """Hand every record written since the last call to ``handle``; how many."""
        return asyncio.run(self._read(handle, time.monotonic() + timeout))

    async def _read(self, handle: Handler, deadline: float) -> int:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            group_id=None,
            enable_auto_commit=False,
            isolation_level="read_committed",
            max_partition_fetch_bytes=8 * 1024 * 1024,
            fetch_max_bytes=64 * 1024 * 1024,
        )
        await consumer.start()
        try:
            tps = await self._partitions()
            if not tps:
                return 0
            consumer.assign(tps)
            for tp in tps:
                consumer.seek(tp, self.next.get(tp.partition, 0))
            ends = await consumer.end_offsets(tps)
            return await self._drain(consumer, ends, handle, deadline)
        finally:
            await consumer.stop()

    async def _partitions(self) -> list[TopicPartition]:
        found = await partitions_of(self.bootstrap, self.topic, wait_s=0.0)
        return [TopicPartition(self.topic, p) for p in found]

    async def _drain(
        self,
        consumer: AIOKafkaConsumer,
        ends: dict[TopicPartition, int],
        handle: Handler,
        deadline: float,
    ) -> int:
        count = 0
        behind = {tp for tp, end in ends.items() if self.next.get(tp.partition, 0) < end}
        while behind:
            fetched = await consumer.getmany(*behind, timeout_ms=500)
            for tp, records in fetched.items():
                end = ends[tp]
                usable = [r for r in records if r.offset < end]
                if usable:
                    handle(tp.partition, usable)
                    count += len(usable)
            for tp in list(behind):
                position = await consumer.position(tp)
                self.next[tp.partition] = min(position, ends[tp])
                if position >= ends[tp]:
                    behind.discard(tp)
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {self.topic} did not reach its end offsets")
        self.records += count
        return count


def end_offsets(bootstrap: str, topics: Sequence[str]) -> dict[tuple[str, int], int]:
    """The end offsets (last stable, for transactional topics) of every partition."""

    async def read() -> dict[tuple[str, int], int]:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap, group_id=None, isolation_level="read_committed"
        )
        await consumer.start()
        try:
            tps = []
            for topic in topics:
                found = await partitions_of(bootstrap, topic, wait_s=0.0)
                tps += [TopicPartition(topic, p) for p in found]
            ends = await consumer.end_offsets(tps) if tps else {}
            return {(tp.topic, tp.partition): end for tp, end in ends.items()}
        finally:
            await consumer.stop()

    return asyncio.run(read())


async def committed_offsets(admin: AIOKafkaAdminClient, group: str) -> dict[tuple[str, int], int]:
    """The group's committed offset of every partition it committed."""
    found = await admin.list_consumer_group_offsets(group)
    return {(tp.topic, tp.partition): meta.offset for tp, meta in found.items() if meta.offset >= 0}
