"""The benchmark's Kafka: started by ops/kafka.sh on its own port, stopped by process id;
and the plain aiokafka clients that preload data and read offsets."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic, RecordsToDelete

from bench.config import KAFKA_DIR, KAFKA_PORT, PARTITIONS, ROOT
from core.admin import ensure_topics
from core.topics import partition_for, topic_specs

#: (key, value) of one record; key None means "spread round-robin".
Pair = tuple[bytes | None, bytes]


@dataclass(frozen=True)
class BenchKafka:
    """A one-node local cluster under .cache/bench-kafka."""

    port: int = KAFKA_PORT
    directory: Path = KAFKA_DIR

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def broker_url(self) -> str:
        return f"kafka://{self.bootstrap}"

    def _env(self) -> dict[str, str]:
        return {
            **os.environ,
            "KAFKA_PORT": str(self.port),
            "KAFKA_BROKERS": "1",
            "KAFKA_DIR": str(self.directory),
            "KAFKA_HEAP": os.environ.get("BENCH_KAFKA_HEAP", "1g"),
        }

    def fresh(self) -> None:
        """Stop a cluster left over in the directory, delete its data and start anew."""
        self.down()
        shutil.rmtree(self.directory, ignore_errors=True)
        subprocess.run([str(ROOT / "ops/kafka.sh"), "up"], env=self._env(), check=True)

    def down(self) -> None:
        """Stop the nodes by the process ids in their pid files."""
        if self.directory.exists():
            subprocess.run([str(ROOT / "ops/kafka.sh"), "down"], env=self._env(), check=True)

    def version(self) -> str:
        pom = (ROOT / "ops/kafka/pom.xml").read_text()
        start = pom.find("<kafka.version>") + len("<kafka.version>")
        return pom[start : pom.find("</kafka.version>")]


async def create_project_topics(bootstrap: str) -> None:
    """The project's topics, as the workers would create them."""
    await ensure_topics(bootstrap, topic_specs(PARTITIONS, -1), 1)


async def create_topic(bootstrap: str, name: str, config: dict[str, str]) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        if name not in set(await admin.list_topics()):
            await admin.create_topics([NewTopic(name, PARTITIONS, 1, topic_configs=config)])
    finally:
        await admin.close()


async def produce(
    bootstrap: str,
    topic: str,
    records: Iterable[Pair],
    timestamp_ms: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> int:
    """Write records in whole batches per partition (keyed ones by murmur2, like Java).

    Batches built by hand go several times faster than one ``send`` per record, which
    keeps the preloading of millions of records short.
    """
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks=1, linger_ms=50, max_batch_size=512 * 1024
    )
    await producer.start()
    batches: dict[int, Any] = {}
    pending: list[asyncio.Future[Any]] = []
    sent = 0
    try:
        for key, value in records:
            partition = sent % PARTITIONS if key is None else partition_for(key, PARTITIONS)
            batch = batches.get(partition) or producer.create_batch()
            batches[partition] = batch
            if batch.append(key=key, value=value, timestamp=timestamp_ms) is None:
                pending.append(await producer.send_batch(batch, topic, partition=partition))
                batch = batches[partition] = producer.create_batch()
                batch.append(key=key, value=value, timestamp=timestamp_ms)
            sent += 1
            if len(pending) > 64:
                await asyncio.gather(*pending)
                pending.clear()
                if progress is not None:
                    progress(sent)
        for partition, batch in batches.items():
            if batch.record_count():
                pending.append(await producer.send_batch(batch, topic, partition=partition))
        await asyncio.gather(*pending)
    finally:
        await producer.stop()
    return sent


async def topic_partitions(admin: AIOKafkaAdminClient, topics: list[str]) -> list[TopicPartition]:
    """Every partition of ``topics`` that exist (absent topics give none)."""
    described = await admin.describe_topics(topics)
    return [
        TopicPartition(d["topic"], p["partition"])
        for d in described
        if not d.get("error_code")
        for p in d["partitions"]
    ]


async def offsets(bootstrap: str, topics: list[str], end: bool = True) -> dict[TopicPartition, int]:
    """The end (or beginning) offsets of every partition of ``topics``."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await admin.start()
    await consumer.start()
    try:
        tps = await topic_partitions(admin, topics)
        if not tps:
            return {}
        found = await (consumer.end_offsets(tps) if end else consumer.beginning_offsets(tps))
        return dict(found)
    finally:
        await consumer.stop()
        await admin.close()


def records_in(bootstrap: str, topics: list[str]) -> int:
    """How many records ``topics`` hold now (end minus beginning offsets)."""
    ends = asyncio.run(offsets(bootstrap, topics, end=True))
    starts = asyncio.run(offsets(bootstrap, topics, end=False))
    return sum(ends.values()) - sum(starts.values())


async def truncate(bootstrap: str, topics: list[str]) -> None:
    """Delete every record of ``topics`` (so that a later worker finds nothing left)."""
    ends = await offsets(bootstrap, topics)
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        todo = {tp: RecordsToDelete(end) for tp, end in ends.items() if end > 0}
        if todo:
            await admin.delete_records(todo)
    finally:
        await admin.close()


class OffsetWatch:
    """Reads a consumer group's committed offsets and the topics' end offsets."""

    def __init__(
        self, bootstrap: str, group: str, topic_groups: dict[str, str] | None = None
    ) -> None:
        self.bootstrap = bootstrap
        self.group = group
        #: topics another group commits: topic -> that group
        self.topic_groups = dict(topic_groups or {})
        self.admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        self.consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)

    async def __aenter__(self) -> OffsetWatch:
        await self.admin.start()
        await self.consumer.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.consumer.stop()
        await self.admin.close()

    async def committed(self) -> dict[str, int]:
        """Committed records per topic (the sum of committed offsets over partitions), of
        the group and of ``topic_groups`` for their topics."""
        totals = await self._committed(self.group)
        totals = {t: n for t, n in totals.items() if t not in self.topic_groups}
        for topic, group in self.topic_groups.items():
            theirs = await self._committed(group)
            if topic in theirs:
                totals[topic] = theirs[topic]
        return totals

    async def _committed(self, group: str) -> dict[str, int]:
        try:
            offsets = await self.admin.list_consumer_group_offsets(group)
        except Exception:  # the group has not committed yet / coordinator loading
            return {}
        totals: dict[str, int] = {}
        for tp, meta in offsets.items():
            if meta.offset >= 0:
                totals[tp.topic] = totals.get(tp.topic, 0) + meta.offset
        return totals

    async def ends(self, topics: list[str]) -> dict[str, int]:
        """Records per topic (the sum of end offsets over partitions); absent topics: 0."""
        tps = await topic_partitions(self.admin, topics) if topics else []
        if not tps:
            return {}
        totals: dict[str, int] = {}
        for tp, end in (await self.consumer.end_offsets(tps)).items():
            totals[tp.topic] = totals.get(tp.topic, 0) + end
        return totals
