"""The foundation: the local Kafka scripts and a worker whose HTTP API answers."""

from __future__ import annotations

import asyncio
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from tests.support.kafka import ROOT, TEST_PORT, LocalKafka, local_kafka, running
from tests.support.workers import Worker

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def kafka() -> Iterator[LocalKafka]:
    with local_kafka("foundation") as cluster:
        yield cluster


def test_kafka_up_is_idempotent_and_status_reports_nodes(kafka: LocalKafka) -> None:
    pids = kafka.pids()
    kafka.up()
    assert kafka.pids() == pids
    status = subprocess.run(
        [str(ROOT / "ops/kafka.sh"), "status"], env=kafka.env(), capture_output=True, text=True
    )
    assert status.returncode == 0
    assert f"running (pid {pids[0]}) on 127.0.0.1:{kafka.port}" in status.stdout


def test_kafka_down_when_nothing_runs_is_harmless(tmp_path: Path) -> None:
    idle = LocalKafka(port=kafka_port_unused(), brokers=1, directory=tmp_path / "none")
    idle.down()
    (tmp_path / "none").mkdir()
    idle.down()


def kafka_port_unused() -> int:
    return 39992


def test_worker_serves_health_before_and_ready_after_assignment(
    kafka: LocalKafka, tmp_path: Path
) -> None:
    worker = Worker(kafka, tmp_path / "w1").start()
    try:
        assert worker.wait_until("/health") == {"status": "ok"}
        worker.wait_ready()
        code, body = worker.get("/ready")
        assert code == 200
        assert body["status"] == "ready"
        code, _ = worker.get("/openapi.json")
        assert code == 200
    finally:
        worker.stop()
    assert "Traceback" not in worker.log_text()


def test_local_kafka_produces_consumes_and_keeps_topic_configs(kafka: LocalKafka) -> None:
    asyncio.run(_round_trip_with_a_compacted_topic(kafka.bootstrap))


async def _topic_configs(admin: AIOKafkaAdminClient, topic: str) -> dict[str, str]:
    """The topic's configs once the broker that answers knows the topic: a describe just
    after the create may reach it first and answer UNKNOWN_TOPIC_OR_PARTITION (3)."""
    resource = ConfigResource(ConfigResourceType.TOPIC, topic)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 15.0
    while True:
        described = await admin.describe_configs([resource])
        error_code, message, _, _, entries = described[0].resources[0][:5]
        if error_code == 0:
            return {entry[0]: entry[1] for entry in entries}
        if loop.time() > deadline:
            raise AssertionError(f"describe_configs({topic}): error {error_code} {message}")
        await asyncio.sleep(0.2)


async def _round_trip_with_a_compacted_topic(bootstrap: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics(
            [NewTopic("foundation-compacted", 3, 1, topic_configs={"cleanup.policy": "compact"})]
        )
        configs = await _topic_configs(admin, "foundation-compacted")
        assert configs["cleanup.policy"] == "compact"
    finally:
        await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for n in range(10):
            await producer.send_and_wait("foundation-compacted", f"v{n}".encode(), key=b"k%d" % n)
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(
        "foundation-compacted", bootstrap_servers=bootstrap, auto_offset_reset="earliest"
    )
    await consumer.start()
    try:
        seen: dict[bytes, bytes] = {}
        while len(seen) < 10:
            batches = await consumer.getmany(timeout_ms=5000)
            assert batches, "no records came back"
            for records in batches.values():
                seen.update((r.key, r.value) for r in records if r.key and r.value)
        assert seen == {b"k%d" % n: f"v{n}".encode() for n in range(10)}
    finally:
        await consumer.stop()


def test_kafka_kill_and_down_stop_the_jvm_it_started_from_the_class_archive(
    tmp_path: Path,
) -> None:
    # Below the kernel's ephemeral ports (32768 and up), which a client's connection may
    # hold: a fixed port there was once taken when the broker came to bind it.
    port = TEST_PORT + 2500
    cluster = LocalKafka(port=port, brokers=1, directory=tmp_path / "own")
    archive = next((ROOT / ".cache").glob("kafka-*/kafka.jsa"))  # written by `jars`
    cluster.up()
    try:
        (pid,) = cluster.pids()
        command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        assert b"kafka.Kafka" in command
        assert f"-XX:SharedArchiveFile={archive}".encode() in command
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
        cluster.kill()
        assert not running(pid)
        assert cluster.pids() == []
        cluster.up()  # the same data after a kill -9
        (pid,) = cluster.pids()
    finally:
        cluster.down()
    assert not running(pid)
    assert cluster.pids() == []
