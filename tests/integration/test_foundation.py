"""The foundation: the local Kafka scripts and a worker whose HTTP API answers."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.kafka import ROOT, LocalKafka, local_kafka
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
