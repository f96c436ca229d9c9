"""Records Kafka refuses, against a real broker and real workers: a refusal of one record
is that record's problem, not its partition's.

Each test runs one worker under each guarantee. Valid events whose event time lies hours
or years from now are applied; an output too large for its topic, without a key for a
compacted topic or with a timestamp its topic refuses, and a table value that outgrows
its changelog's ``max.message.bytes``, send the input records that made them to their
dead-letter topic with Kafka's reason, and everything else takes effect. Topics with a
small ``max.message.bytes`` make size refusals cheap to provoke.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import MessageSizeTooLargeError

from core.topics import partition_for
from tables.limits import record_batch_bytes
from tests.support.kafka import TEST_PORT, LocalKafka, local_kafka
from tests.support.kafka_io import (
    Record,
    committed_records,
    create_topics,
    produce,
    read_topic,
    wait_for,
)
from tests.support.workers import Worker

pytestmark = pytest.mark.integration

PORT = TEST_PORT + 3500
HOUR_MS = 3_600_000
YEAR_MS = 365 * 24 * HOUR_MS
#: max.message.bytes of the small topics
SMALL = 1000
#: max.message.bytes of the inventory changelog here: a store outgrows it with about 150 skus
INVENTORY_BYTES = 4096

#: A pipeline as a user would add one: it copies each ``edge-in`` record to the topic its
#: value names, with the key and timestamp its value gives.
EDGES = '''
"""Copies each edge-in record to the topic its value names."""

import orjson

from tables.pipeline import Batch, Context, Pipeline

TOPICS = ("edge-small", "edge-compacted", "edge-out", "edge-stuck")


def copy(batch: Batch) -> None:
    for record in batch.of("edge-in"):
        order = orjson.loads(record.value)
        key = order["key"].encode() if order.get("key") is not None else None
        batch.send(order["to"], key, order["value"].encode(), timestamp_ms=order.get("ts"))


def pipelines(context: Context) -> list[Pipeline]:
    return [Pipeline("edges", reads=("edge-in",), produces=(*TOPICS, "edge-in-dlq"), process=copy)]
'''


@pytest.fixture(scope="module")
def kafka() -> Iterator[LocalKafka]:
    with local_kafka("refusals", port=PORT) as cluster:
        create_topics(cluster.bootstrap, {"edge-small": 8}, {"max.message.bytes": str(SMALL)})
        create_topics(cluster.bootstrap, {"edge-compacted": 8}, {"cleanup.policy": "compact"})
        create_topics(cluster.bootstrap, {"edge-out": 8})
        create_topics(cluster.bootstrap, {"edge-stuck": 8})
        # The inventory changelog as the worker would create it, with a small size limit.
        create_topics(
            cluster.bootstrap,
            {"streamstate-inventory-changelog": 8},
            {"cleanup.policy": "compact", "max.message.bytes": str(INVENTORY_BYTES)},
        )
        yield cluster


@pytest.fixture(params=["exactly_once", "at_least_once"])
def worker(request: pytest.FixtureRequest, kafka: LocalKafka, tmp_path: Path) -> Iterator[Worker]:
    (tmp_path / "edges.py").write_text(EDGES)
    env = {
        "PROCESSING_GUARANTEE": request.param,
        "STREAMSTATE_EXTRA_PIPELINES": "edges",
        "PYTHONPATH": str(tmp_path),
        "TABLE_STANDBY_REPLICAS": "0",
    }
    started = Worker(kafka, tmp_path / "w", extra_env=env).start()
    try:
        started.wait_ready(180)
        yield started
    finally:
        started.stop()


def event(
    n: str, store: str, kind: str, ts: int, sku: str = "sku-1", quantity: int = 1
) -> dict[str, Any]:
    found: dict[str, Any] = {
        "event_id": n,
        "store_id": store,
        "sku": sku,
        "kind": kind,
        "quantity": quantity,
        "ts": ts,
    }
    if kind == "sale":
        found["unit_price"] = 2.5
    return found


def caught_up(kafka: LocalKafka, topic: str, count: int, timeout: float = 60.0) -> None:
    """Wait until the group's committed offsets on ``topic`` add up to ``count``."""
    done = wait_for(
        lambda: committed_records(kafka.bootstrap, "streamstate", topic) >= count or None,
        timeout,
        interval=0.3,
    )
    assert done, f"{topic}: the group did not commit {count} records in {timeout} s"


def total(kafka: LocalKafka, topic: str) -> int:
    return len(read_topic(kafka.bootstrap, topic))


def dead_letters(kafka: LocalKafka, source: str, mine: Callable[[Record], bool]) -> list[Record]:
    """The dead letters of ``source`` that ``mine`` picks, in offset order."""
    found = [r for r in read_topic(kafka.bootstrap, f"{source}-dlq") if mine(r)]
    return sorted(found, key=lambda r: (r.partition, r.offset))


def value_of(worker: Worker, table: str, key: str) -> Any:
    status, body = worker.get(f"/tables/{table}/keys/{key}")
    return body["value"] if status == 200 else None


def on_partition(name: str, partition: int) -> str:
    """``name`` with a suffix that puts it on ``partition`` (of 8)."""
    n = 0
    while partition_for(f"{name}-{n}".encode(), 8) != partition:
        n += 1
    return f"{name}-{n}"


def largest_value(key: bytes, limit: int) -> bytes:
    """The longest value whose record with ``key`` is a record batch of ``limit`` bytes
    at most."""
    value = b"x" * limit
    while record_batch_bytes(key, value) > limit:
        value = value[:-1]
    return value


#: The partition the event-time test's stores live on: its join's event time jumps years
#: ahead, so the tests that settle pairs use other partitions.
FAR_PARTITION = 0


def test_events_hours_and_years_from_now_are_applied_and_their_outputs_taken(
    kafka: LocalKafka, worker: Worker
) -> None:
    now = int(time.time() * 1000)
    tag = worker.extra_env["PROCESSING_GUARANTEE"]
    times = {
        "2h-ahead": now + 2 * HOUR_MS,
        "3y-ahead": now + 3 * YEAR_MS,
        "2h-behind": now - 2 * HOUR_MS,
        "3y-behind": now - 3 * YEAR_MS,
    }
    sales, payments = [], []
    for name, ts in times.items():
        store = on_partition(f"when-{tag}-{name}", FAR_PARTITION)
        sale = event(f"{store}-sale", store, "sale", ts)
        sales.append((store, sale))
        payment = {
            "payment_id": f"{store}-pay",
            "sale_event_id": sale["event_id"],
            "store_id": store,
            "amount": 2.5,
            "ts": ts + 60_000,
        }
        payments.append((store, payment))
    before = total(kafka, "item-events"), total(kafka, "payments")
    produce(kafka.bootstrap, "item-events", sales)  # record timestamps: now
    produce(kafka.bootstrap, "payments", payments)
    caught_up(kafka, "item-events", before[0] + len(sales))
    caught_up(kafka, "payments", before[1] + len(payments))
    for store, sale in sales:
        found = value_of(worker, "inventory", store)
        assert found == {"store_id": store, "on_hand": {"sku-1": -1}, "updated_at": sale["ts"]}
    # The sales are counted in the hours of their event time (years back: expired)...
    for name in ("2h-ahead", "3y-ahead", "2h-behind"):
        path = f"/tables/sales_by_category/keys/unknown?at={times[name]}"
        counted = wait_for(lambda path=path: worker.get(path)[0] == 200 or None, 30, 0.2)
        assert counted, (name, worker.get(path))
    # ...and the records that carry them have their inputs' time (now), which the topic
    # takes, not the hour they are counted in.
    later = int(time.time() * 1000)
    sums = read_topic(kafka.bootstrap, "streamstate-sales_by_category-repartition")
    # (a repartition record carries a partition's combined sums: its value names the key)
    assert [r for r in sums if b'"unknown"' in (r.value or b"")]
    assert all(later - HOUR_MS <= r.timestamp <= later for r in sums)
    stores = {store.encode() for store, _ in sales}
    assert not dead_letters(kafka, "item-events", lambda r: r.key in stores)
    assert not dead_letters(kafka, "payments", lambda r: r.key in stores)
    status, ready = worker.get("/ready")
    assert (status, ready["stalled"]) == (200, [])


def test_outputs_their_topics_refuse_send_their_inputs_to_the_dead_letters(
    kafka: LocalKafka, worker: Worker
) -> None:
    tag = worker.extra_env["PROCESSING_GUARANTEE"]
    now = int(time.time() * 1000)
    fits = largest_value(b"fits", SMALL).decode()
    too_large = record_batch_bytes(b"too-large", fits.encode() + b"x")
    orders = [
        {"to": "edge-small", "key": "fits", "value": fits},
        {"to": "edge-small", "key": "too-large", "value": fits + "x"},
        {"to": "edge-compacted", "key": None, "value": f"{tag}-keyless"},
        {"to": "edge-compacted", "key": "keyed", "value": f"{tag}-keyed"},
        {"to": "edge-out", "key": "late", "value": f"{tag}-ahead", "ts": now + 2 * HOUR_MS},
        {"to": "edge-out", "key": "now", "value": f"{tag}-now", "ts": now},
    ]
    base = total(kafka, "edge-in")
    dead_before = len(dead_letters(kafka, "edge-in", lambda r: r.key == b"k"))
    # All on one partition: the refused records share their batches with good ones.
    produce(kafka.bootstrap, "edge-in", [(b"k", order) for order in orders])
    caught_up(kafka, "edge-in", base + len(orders), 90)
    dead = dead_letters(kafka, "edge-in", lambda r: r.key == b"k")[dead_before:]
    reasons = {orjson.loads(r.value or b"{}")["key"]: r.headers["error"].decode() for r in dead}
    assert len(dead) == 3, reasons
    assert reasons["too-large"].startswith(
        f"MessageSizeTooLargeError: the record is {too_large:,} bytes as a record batch; "
        f"topic edge-small takes at most {SMALL:,} (max.message.bytes)"
    )
    assert reasons[None].startswith("InvalidRecordError: topic edge-compacted is compacted")
    assert reasons["late"].startswith("InvalidTimestampError: topic edge-out: timestamp")
    assert [r.value for r in read_topic(kafka.bootstrap, "edge-small") if r.key == b"fits"]
    keyed = {r.value for r in read_topic(kafka.bootstrap, "edge-compacted")}
    assert f"{tag}-keyed".encode() in keyed
    assert f"{tag}-now".encode() in {r.value for r in read_topic(kafka.bootstrap, "edge-out")}


def test_the_broker_refuses_one_byte_more_than_max_message_bytes(kafka: LocalKafka) -> None:
    """What the checks before sending count is what the broker counts."""

    async def send(value: bytes) -> None:
        producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap)
        await producer.start()
        try:
            batch = producer.create_batch()
            batch.append(key=b"fits", value=value, timestamp=None)
            await (await producer.send_batch(batch, "edge-small", partition=0))
        finally:
            await producer.stop()

    fits = largest_value(b"fits", SMALL)
    assert record_batch_bytes(b"fits", fits) == SMALL
    asyncio.run(send(fits))
    with pytest.raises(MessageSizeTooLargeError):
        asyncio.run(send(fits + b"x"))


def test_a_store_whose_value_outgrows_its_changelog_refuses_the_events_that_grow_it(
    kafka: LocalKafka, worker: Worker
) -> None:
    tag = worker.extra_env["PROCESSING_GUARANTEE"]
    store = f"big-{tag}"
    now = int(time.time() * 1000)
    restocks = [
        event(f"{store}-{n}", store, "restock", now, sku=f"SKU-{n:05d}") for n in range(400)
    ]
    neighbour = on_partition(f"store-near-{tag}", partition_for(store.encode(), 8))
    later = [
        event(f"{store}-again", store, "restock", now, sku="SKU-00000", quantity=1),
        event(f"{neighbour}-1", neighbour, "restock", now),
    ]
    base = total(kafka, "item-events")
    produce(kafka.bootstrap, "item-events", [(store, e) for e in restocks])
    produce(kafka.bootstrap, "item-events", [(e["store_id"], e) for e in later])
    caught_up(kafka, "item-events", base + len(restocks) + len(later), 120)
    dead = dead_letters(kafka, "item-events", lambda r: r.key == store.encode())
    refused = [orjson.loads(r.value or b"{}")["sku"] for r in dead]
    value = value_of(worker, "inventory", store)
    kept = sorted(value["on_hand"])
    # The skus kept are the first ones; every later new sku was refused.
    assert kept == [f"SKU-{n:05d}" for n in range(len(kept))]
    assert refused == [f"SKU-{n:05d}" for n in range(len(kept), 400)]
    assert 50 < len(kept) < 400
    assert value["on_hand"]["SKU-00000"] == 2  # the partition went on with the store
    assert value_of(worker, "inventory", neighbour)["on_hand"] == {"sku-1": 1}
    for record in dead:
        reason = record.headers["error"].decode()
        assert reason.startswith("MessageSizeTooLargeError: the record is")
        assert "topic streamstate-inventory-changelog takes at most 4,096" in reason
        assert reason.endswith(f"(table inventory, key b'{store}')")
    stored = orjson.dumps(value)
    assert record_batch_bytes(store.encode(), stored) <= INVENTORY_BYTES


def alter(kafka: LocalKafka, topic: str, config: dict[str, str]) -> None:
    async def go() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka.bootstrap)
        await admin.start()
        try:
            await admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, topic, config)])
        finally:
            await admin.close()

    asyncio.run(go())


def test_a_refusal_after_the_topic_changed_under_the_worker_is_the_records_alone(
    kafka: LocalKafka, worker: Worker
) -> None:
    """The worker reads settled-sales' rules when its tasks start; then they change: Kafka
    refuses a pair, the worker reads them again and sends the payment that made it to the
    DLQ, and the other pairs settle."""
    tag = worker.extra_env["PROCESSING_GUARANTEE"]
    store = on_partition(f"pairs-{tag}", 5)
    now = int(time.time() * 1000)
    sales = [event(f"{store}-s{n}", store, "sale", now) for n in range(3)]
    # Its pair is larger than 700 bytes (fields of a valid event are 256 chars at most).
    sales[1]["event_id"] += "-" + "E" * 200
    sales[1]["sku"] = "L" * 250
    payments = [
        {
            "payment_id": f"{store}-p{n}",
            "sale_event_id": sale["event_id"],
            "store_id": store,
            "amount": 2.5,
            "ts": now + 1000,
        }
        for n, sale in enumerate(sales)
    ]
    base = total(kafka, "item-events"), total(kafka, "payments")
    retries_before = retries(worker)
    produce(kafka.bootstrap, "item-events", [(store, s) for s in sales])
    caught_up(kafka, "item-events", base[0] + len(sales))  # the tasks have read the rules
    retained = {"retention.ms": "-1", "cleanup.policy": "delete"}
    alter(kafka, "settled-sales", {**retained, "max.message.bytes": "700"})
    try:
        produce(kafka.bootstrap, "payments", [(store, p) for p in payments])
        caught_up(kafka, "payments", base[1] + len(payments), 90)
        dead = dead_letters(kafka, "payments", lambda r: r.key == store.encode())
        refused = [orjson.loads(r.value or b"{}")["payment_id"] for r in dead]
        assert refused == [f"{store}-p1"], worker.log_tail(60)
        assert dead[0].headers["error"].decode().startswith("MessageSizeTooLargeError")
        pairs = [
            orjson.loads(r.value or b"{}")["payment"]["payment_id"]
            for r in read_topic(kafka.bootstrap, "settled-sales")
            if r.key == store.encode()
        ]
        assert set(pairs) == {f"{store}-p0", f"{store}-p2"}
        if tag == "exactly_once":
            assert sorted(pairs) == [f"{store}-p0", f"{store}-p2"]
        assert retries(worker) > retries_before  # Kafka refused first: the cycle ran again
    finally:
        alter(kafka, "settled-sales", retained)


def retries(worker: Worker) -> float:
    """Cycles the worker attempted again at once after Kafka refused records."""
    status, text = worker.get("/metrics")
    assert status == 200
    for line in str(text).splitlines():
        if line.startswith('streamstate_cycle_retries_total{cause="refusal"}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_a_partition_kafka_takes_nothing_from_shows_where_it_is_stuck_until_kafka_takes_it(
    kafka: LocalKafka, worker: Worker
) -> None:
    """A deleted output topic: the producer retries (the partition has no leader) and the
    cycle waits; /ready and /metrics say which partition waits, where; a new topic of
    that name takes the records and the partition moves again."""
    tag = worker.extra_env["PROCESSING_GUARANTEE"]
    key = on_partition(f"stuck-{tag}", 6)
    base = total(kafka, "edge-in")
    offset = len([r for r in read_topic(kafka.bootstrap, "edge-in") if r.partition == 6])
    delete(kafka, "edge-stuck")
    try:
        order = {"to": "edge-stuck", "key": key, "value": tag}
        produce(kafka.bootstrap, "edge-in", [(key, order)])

        def stalled() -> Any:
            status, body = worker.get("/ready")
            return (status, body) if status == 503 and body["status"] == "stalled" else None

        found = wait_for(stalled, 40, 0.5)
        assert found, worker.get("/ready")
        [partition] = found[1]["stalled"]
        assert partition["partition"] == 6
        assert partition["inputs"]["edge-in"] == offset
        assert partition["error"] == "Waiting"
        assert found[1]["detail"].startswith("partition 6 has not advanced for 1")
        text = str(worker.get("/metrics")[1])
        assert 'streamstate_partition_stalled{error="Waiting",partition="6"} 1.0' in text
        inputs = f'streamstate_stalled_input_offset{{partition="6",topic="edge-in"}} {offset}.0'
        assert inputs in text
    finally:
        create_topics(kafka.bootstrap, {"edge-stuck": 8})
    caught_up(kafka, "edge-in", base + 1, 90)
    assert wait_for(lambda: worker.get("/ready")[0] == 200 or None, 30, 0.5)
    assert worker.get("/ready")[1]["stalled"] == []
    assert tag.encode() in {r.value for r in read_topic(kafka.bootstrap, "edge-stuck")}


def delete(kafka: LocalKafka, topic: str) -> None:
    async def go() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka.bootstrap)
        await admin.start()
        try:
            await admin.delete_topics([topic])
        finally:
            await admin.close()

    asyncio.run(go())
    assert wait_for(lambda: not any(r for r in [0] if topic in _topics(kafka)) or None, 30, 0.5)


def _topics(kafka: LocalKafka) -> list[str]:
    from tests.support.kafka_io import list_topics

    return asyncio.run(list_topics(kafka.bootstrap))
