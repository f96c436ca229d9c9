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

from agents.schemas import demo_topic_specs
from bench.config import KAFKA_DIR, KAFKA_PORT, PARTITIONS, ROOT
from core.admin import ensure_topics
from core.topics import partition_for

#: (key, value) of one record; key None means "spread round-robin".
Pair = tuple[bytes | None, bytes]
#: A record with its own timestamp (epoch ms).
Stamped = tuple[bytes | None, bytes, int]


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
    await ensure_topics(bootstrap, demo_topic_specs(PARTITIONS, -1), 1)


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
    records: Iterable[Pair] | Iterable[Stamped],
    timestamp_ms: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> int:
    """Write records in whole batches per partition (keyed ones by murmur2, like Java),
    timestamped ``timestamp_ms`` (None: now) unless a record carries its own.

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
        for key, value, *stamp in records:
            timestamp = stamp[0] if stamp else timestamp_ms
            partition = sent % PARTITIONS if key is None else partition_for(key, PARTITIONS)
            batch = batches.get(partition) or producer.create_batch()
            batches[partition] = batch
            if batch.append(key=key, value=value, timestamp=timestamp) is None:
                pending.append(await producer.send_batch(batch, topic, partition=partition))
                batch = batches[partition] = producer.create_batch()
                batch.append(key=key, value=value, timestamp=timestamp)
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


async def read_topic(bootstrap: str, topic: str) -> list[tuple[bytes | None, bytes | None]]:
    """Every committed record of ``topic`` (key, value), partition by partition, read
    ``read_committed`` from its start to its last stable offsets."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        isolation_level="read_committed",
        max_partition_fetch_bytes=4 * 1024 * 1024,
    )
    await admin.start()
    await consumer.start()
    records: list[tuple[bytes | None, bytes | None]] = []
    try:
        tps = await topic_partitions(admin, [topic])
        if not tps:
            return records
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        todo = {tp for tp in tps if ends[tp] > await consumer.position(tp)}
        while todo:
            fetched = await consumer.getmany(*todo, timeout_ms=1000, max_records=10_000)
            for messages in fetched.values():
                records.extend((m.key, m.value) for m in messages)
            todo = {tp for tp in todo if await consumer.position(tp) < ends[tp]}
    finally:
        await consumer.stop()
        await admin.close()
    return records


async def delete_topics(bootstrap: str, prefixes: tuple[str, ...], names: tuple[str, ...]) -> None:
    """Delete every topic whose name starts with one of ``prefixes`` or is in ``names``,
    and wait until the broker no longer lists them."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        doomed = [t for t in await admin.list_topics() if t.startswith(prefixes) or t in set(names)]
        if doomed:
            await admin.delete_topics(doomed)
        for _ in range(240):
            if not set(doomed) & set(await admin.list_topics()):
                return
            await asyncio.sleep(0.25)
        raise TimeoutError(f"topics not deleted after 60 s: {sorted(doomed)}")
    finally:
        await admin.close()


async def rewind_group(bootstrap: str, group: str, topics: list[str]) -> None:
    """Commit the beginning offsets of ``topics`` for ``group``, which must have no members:
    its next member reads them again from the start."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False
    )
    await admin.start()
    await consumer.start()
    try:
        tps = await topic_partitions(admin, topics)
        consumer.assign(tps)
        starts = await consumer.beginning_offsets(tps)
        await consumer.commit(dict(starts))
    finally:
        await consumer.stop()
        await admin.close()


class OffsetWatch:
    """Reads a consumer group's committed offsets and the topics' end offsets.

    The end offsets are the last stable offsets (read ``read_committed``). Under exactly
    once a topic written in transactions ends with a commit marker, which is no record:
    a group that has consumed everything may have committed the offset of the marker
    rather than the one past it. :meth:`caught_up` tells such partitions apart from
    partitions with records left, by reading what is left of them.
    """

    def __init__(
        self, bootstrap: str, group: str, topic_groups: dict[str, str] | None = None
    ) -> None:
        self.bootstrap = bootstrap
        self.group = group
        #: topics another group commits: topic -> that group
        self.topic_groups = dict(topic_groups or {})
        self.admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        self.consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            enable_auto_commit=False,
            isolation_level="read_committed",
            fetch_max_wait_ms=100,
        )
        #: partitions whose remaining offsets were read and held no record, with the
        #: (committed, end) offsets of that read
        self.only_markers: dict[TopicPartition, tuple[int, int]] = {}

    async def __aenter__(self) -> OffsetWatch:
        await self.admin.start()
        await self.consumer.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.consumer.stop()
        await self.admin.close()

    async def committed_offsets(self) -> dict[TopicPartition, int]:
        """The committed offset of every partition, of the group and of ``topic_groups``
        for their topics."""
        offsets = {
            tp: n
            for tp, n in (await self._committed(self.group)).items()
            if tp.topic not in self.topic_groups
        }
        for topic, group in self.topic_groups.items():
            offsets.update(
                {tp: n for tp, n in (await self._committed(group)).items() if tp.topic == topic}
            )
        return offsets

    async def committed(self) -> dict[str, int]:
        """Committed records per topic (the sum of committed offsets over partitions)."""
        return totals(await self.committed_offsets())

    async def _committed(self, group: str) -> dict[TopicPartition, int]:
        try:
            offsets = await self.admin.list_consumer_group_offsets(group)
        except Exception:  # the group has not committed yet / coordinator loading
            return {}
        return {tp: meta.offset for tp, meta in offsets.items() if meta.offset >= 0}

    async def end_offsets(self, topics: list[str]) -> dict[TopicPartition, int]:
        """The last stable offset of every partition of ``topics`` (absent topics: none)."""
        tps = await topic_partitions(self.admin, topics) if topics else []
        if not tps:
            return {}
        return dict(await self.consumer.end_offsets(tps))

    async def ends(self, topics: list[str]) -> dict[str, int]:
        """Records per topic (the sum of end offsets over partitions); absent topics: 0."""
        return totals(await self.end_offsets(topics))

    async def caught_up(
        self, committed: dict[TopicPartition, int], ends: dict[TopicPartition, int]
    ) -> bool:
        """Whether the group has consumed every record of the partitions in ``ends``.

        A partition behind its end offset counts as consumed when a ``read_committed``
        read from the committed offset reaches the end without a record: only commit
        markers (or aborted records) lay between.
        """
        behind = {
            tp: committed.get(tp, 0)
            for tp, end in ends.items()
            if committed.get(tp, 0) < end
            and self.only_markers.get(tp) != (committed.get(tp, 0), end)
        }
        if not behind:
            return True
        if any(ends[tp] - offset > MARKER_PROBE_LIMIT for tp, offset in behind.items()):
            return False  # records are certainly left: not worth reading
        self.consumer.assign(list(behind))
        for tp, offset in behind.items():
            self.consumer.seek(tp, offset)
        for _ in range(20):
            fetched = await self.consumer.getmany(timeout_ms=100)
            if any(fetched.values()):
                return False
            positions = {tp: await self.consumer.position(tp) for tp in behind}
            if all(positions[tp] >= ends[tp] for tp in behind):
                self.only_markers.update({tp: (n, ends[tp]) for tp, n in behind.items()})
                return True
        return False


#: A partition further behind its end offset than this holds records, not only markers.
MARKER_PROBE_LIMIT = 64


def totals(offsets: dict[TopicPartition, int]) -> dict[str, int]:
    """Offsets summed per topic."""
    out: dict[str, int] = {}
    for tp, offset in offsets.items():
        out[tp.topic] = out.get(tp.topic, 0) + offset
    return out
