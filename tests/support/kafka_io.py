"""Produce to and read from the test Kafka with plain aiokafka clients."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from core.admin import partitions_of
from core.topics import POSITION_KEY


@dataclass(frozen=True)
class Record:
    key: bytes | None
    value: bytes | None
    partition: int
    offset: int
    timestamp: int
    headers: dict[str, bytes]


def encode(value: Any) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    return orjson.dumps(value)


async def _produce(
    bootstrap: str, topic: str, records: Iterable[tuple[Any, ...]], timestamp_ms: int | None
) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    await producer.start()
    try:
        futures = [
            await producer.send(
                topic, encode(record[1]), key=encode(record[0]), timestamp_ms=timestamp_ms
            )
            for record in records
        ]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


def produce(
    bootstrap: str,
    topic: str,
    records: Iterable[tuple[Any, Any]],
    timestamp_ms: int | None = None,
) -> None:
    """Send (key, value) pairs; str and bytes go as they are, anything else as JSON.

    ``timestamp_ms`` sets the records' Kafka timestamp (default: now).
    """
    asyncio.run(_produce(bootstrap, topic, list(records), timestamp_ms))


async def _create(bootstrap: str, topics: dict[str, int], config: dict[str, str]) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        new = [
            NewTopic(name, partitions, 1, topic_configs=config)
            for name, partitions in topics.items()
            if name not in existing
        ]
        if new:
            await admin.create_topics(new)
    finally:
        await admin.close()


def create_topics(
    bootstrap: str, topics: dict[str, int], config: dict[str, str] | None = None
) -> None:
    asyncio.run(_create(bootstrap, topics, config or {}))


async def _read(bootstrap: str, topic: str, wait_s: float) -> list[Record]:
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        isolation_level="read_committed",
    )
    await consumer.start()
    try:
        deadline = time.monotonic() + wait_s
        partitions = await partitions_of(bootstrap, topic, wait_s)
        if not partitions:
            return []
        tps = [TopicPartition(topic, p) for p in sorted(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        out: list[Record] = []
        while [tp for tp, end in ends.items() if end > 0 and await consumer.position(tp) < end]:
            batches = await consumer.getmany(timeout_ms=500)
            for tp, messages in batches.items():
                out.extend(
                    Record(m.key, m.value, tp.partition, m.offset, m.timestamp, dict(m.headers))
                    for m in messages
                )
            if time.monotonic() > deadline + 60:
                raise TimeoutError(f"reading {topic} did not reach its end offsets")
        return out
    finally:
        await consumer.stop()


def read_topic(bootstrap: str, topic: str, timeout: float = 10.0) -> list[Record]:
    """Every committed record of a topic, up to its end offsets now."""
    return asyncio.run(_read(bootstrap, topic, timeout))


async def list_topics(bootstrap: str, request_timeout_ms: int = 40_000) -> list[str]:
    """Every topic of the cluster, internal ones included, sorted."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=request_timeout_ms)
    await admin.start()
    try:
        return sorted(await admin.list_topics())
    finally:
        await admin.close()


def changelog_records(bootstrap: str) -> int:
    """How many committed records all the app's changelog topics hold."""
    topics = [
        t
        for t in asyncio.run(list_topics(bootstrap))
        if t.startswith("streamstate-") and t.endswith("-changelog")
    ]
    return sum(len(read_topic(bootstrap, topic)) for topic in topics)


def changelog_state(bootstrap: str, table: str) -> dict[bytes, Any]:
    """Latest value per key of a table's changelog (tombstones remove the key)."""
    state: dict[bytes, Any] = {}
    for record in read_topic(bootstrap, f"streamstate-{table}-changelog"):
        assert record.key is not None
        if record.key == POSITION_KEY:
            continue  # the engine's record of its source offsets, not a table key
        if record.value is None:
            state.pop(record.key, None)
        else:
            state[record.key] = orjson.loads(record.value)
    return state


def changelog_partitions(bootstrap: str, table: str) -> dict[int, dict[bytes, Any]]:
    """Latest value per key of each partition of a table's changelog (tables whose keys
    repeat from partition to partition, such as a join's index)."""
    state: dict[int, dict[bytes, Any]] = {}
    for record in read_topic(bootstrap, f"streamstate-{table}-changelog"):
        assert record.key is not None
        if record.key == POSITION_KEY:
            continue
        partition = state.setdefault(record.partition, {})
        if record.value is None:
            partition.pop(record.key, None)
        else:
            partition[record.key] = orjson.loads(record.value)
    return state


def changelog_values(bootstrap: str, table: str, key: bytes) -> list[Any]:
    """Every value one key of a table took, in changelog order (None: deleted)."""
    records = sorted(
        (r for r in read_topic(bootstrap, f"streamstate-{table}-changelog") if r.key == key),
        key=lambda r: r.offset,
    )
    return [None if r.value is None else orjson.loads(r.value) for r in records]


def wait_for(check: Callable[[], Any], timeout: float = 60.0, interval: float = 0.5) -> Any:
    """Poll ``check`` until it returns something truthy; return that."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    raise TimeoutError(f"condition not met in {timeout}s (last: {last!r})")


def wait_equal(get: Callable[[], Any], want: Any, timeout: float = 60.0, what: str = "") -> Any:
    """Poll ``get`` until it returns ``want``; on timeout, say how they still differ."""
    deadline = time.monotonic() + timeout
    got: Any = None
    while time.monotonic() < deadline:
        got = get()
        if got == want:
            return got
        time.sleep(0.5)
    raise AssertionError(f"{what or 'value'} never became the expected one: {_diff(got, want)}")


def _diff(got: Any, want: Any) -> str:
    if isinstance(got, dict) and isinstance(want, dict):
        keys = sorted(set(got) | set(want), key=repr)
        wrong = [(k, got.get(k), want.get(k)) for k in keys if got.get(k) != want.get(k)]
        shown = "; ".join(f"{k!r}: got {g!r}, want {w!r}" for k, g, w in wrong[:5])
        return f"{len(wrong)} of {len(keys)} keys differ ({shown})"
    return f"got {got!r}, want {want!r}"


def committed_records(bootstrap: str, group: str, topic: str) -> int:
    """The sum of ``group``'s committed offsets on ``topic``."""

    async def read() -> int:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            offsets = await admin.list_consumer_group_offsets(group)
        finally:
            await admin.close()
        return sum(meta.offset for tp, meta in offsets.items() if tp.topic == topic)

    return asyncio.run(read())


async def _publish(bootstrap: str, records: Sequence[Any]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=10)
    await producer.start()
    try:
        sent = [
            await producer.send(
                r.topic, r.value, key=r.key, partition=r.partition, timestamp_ms=r.timestamp
            )
            for r in records
        ]
        await asyncio.gather(*sent)
    finally:
        await producer.stop()


def publish(bootstrap: str, records: Sequence[Any]) -> None:
    """Produce records as a test driver's log holds them (``topic``, ``key``, ``value``,
    ``partition``, ``timestamp``), each to its own partition with its own timestamp."""
    asyncio.run(_publish(bootstrap, records))
