"""The bench's offset watch on a real broker: a partition whose committed offset stops at
a transaction's commit marker is consumed, one with a record left is not."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.structs import OffsetAndMetadata

from bench.kafka import OffsetWatch, read_topic, rewind_group
from tests.support.kafka import LocalKafka, local_kafka

pytestmark = pytest.mark.integration

TOPIC = "watched"
GROUP = "watcher"


@pytest.fixture(scope="module")
def kafka() -> Iterator[LocalKafka]:
    with local_kafka("bench-offsets") as cluster:
        asyncio.run(prepare(cluster.bootstrap))
        yield cluster


async def prepare(bootstrap: str) -> None:
    """Partition 0: three records in one transaction (offsets 0-2, the marker at 3);
    partition 1: two plain records."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(TOPIC, 2, 1)])
    finally:
        await admin.close()
    transactional = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id="bench-test")
    await transactional.start()
    try:
        async with transactional.transaction():
            for n in range(3):
                await transactional.send_and_wait(TOPIC, f"t{n}".encode(), partition=0)
    finally:
        await transactional.stop()
    plain = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await plain.start()
    try:
        for n in range(2):
            await plain.send_and_wait(TOPIC, f"p{n}".encode(), partition=1)
    finally:
        await plain.stop()


async def commit(bootstrap: str, offsets: dict[int, int]) -> None:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=GROUP)
    await consumer.start()
    try:
        tps = {TopicPartition(TOPIC, p): OffsetAndMetadata(o, "") for p, o in offsets.items()}
        consumer.assign(list(tps))
        await consumer.commit(tps)
    finally:
        await consumer.stop()


async def consumed(bootstrap: str) -> tuple[bool, dict[str, int]]:
    async with OffsetWatch(bootstrap, GROUP) as watch:
        committed = await watch.committed_offsets()
        ends = await watch.end_offsets([TOPIC])
        return await watch.caught_up(committed, ends), await watch.ends([TOPIC])


def test_a_committed_offset_at_the_commit_marker_counts_as_consumed(kafka: LocalKafka) -> None:
    asyncio.run(commit(kafka.bootstrap, {0: 3, 1: 2}))
    done, ends = asyncio.run(consumed(kafka.bootstrap))
    assert ends == {TOPIC: 4 + 2}
    assert done


def test_a_partition_with_a_record_left_is_not_consumed(kafka: LocalKafka) -> None:
    asyncio.run(commit(kafka.bootstrap, {0: 2, 1: 2}))
    assert not asyncio.run(consumed(kafka.bootstrap))[0]
    asyncio.run(commit(kafka.bootstrap, {0: 4, 1: 1}))
    assert not asyncio.run(consumed(kafka.bootstrap))[0]


def test_rewind_and_read_back(kafka: LocalKafka) -> None:
    asyncio.run(rewind_group(kafka.bootstrap, GROUP, [TOPIC]))
    assert not asyncio.run(consumed(kafka.bootstrap))[0]
    values = sorted(v for _k, v in asyncio.run(read_topic(kafka.bootstrap, TOPIC)))
    assert values == [b"p0", b"p1", b"t0", b"t1", b"t2"]
