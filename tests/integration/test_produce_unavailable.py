"""POST /topics/{topic}/records when Kafka goes away under a running worker: a 503 with
a reason and Retry-After, never a 500."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.support.kafka import TEST_PORT, LocalKafka, local_kafka
from tests.support.ports import require_free_port
from tests.support.workers import Worker

pytestmark = pytest.mark.integration


@dataclass
class Setup:
    kafka: LocalKafka
    worker: Worker


@pytest.fixture
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    require_free_port(TEST_PORT)
    with local_kafka("produce-unavailable") as kafka:
        worker = Worker(kafka, tmp_path_factory.mktemp("unavailable") / "w0").start()
        try:
            worker.wait_ready(180)
            yield Setup(kafka, worker)
        finally:
            # Kafka may be down here: a SIGTERM must stop the worker all the same.
            assert worker.stop(), "a SIGTERM did not stop the worker within 30 s"


def post_line(worker: Worker) -> tuple[int, Any, Any]:
    """POST one text line: (status, decoded JSON answer, headers)."""
    request = urllib.request.Request(
        f"{worker.url}/topics/text-lines/records",
        data=json.dumps({"records": [{"key": None, "value": "still there?"}]}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=90) as answer:
            return answer.status, json.loads(answer.read()), answer.headers
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read()), error.headers


def test_a_write_while_kafka_is_down_is_a_503_with_retry_after(setup: Setup) -> None:
    assert post_line(setup.worker)[0] == 200  # the producer is connected
    setup.kafka.down()
    status, body, headers = post_line(setup.worker)
    assert status == 503, body
    assert int(headers["Retry-After"]) > 0
    # Refused after the acknowledgement's timeout, or at once if the worker saw its
    # connections go first.
    if body["detail"].startswith("Kafka did not acknowledge every record for text-lines"):
        assert "0 of 1 records were written" in body["detail"]
    else:
        assert body["detail"].startswith("no live connection to any Kafka broker"), body
    # Once /ready reports the broker gone, a write is refused at once, nothing handed on.
    deadline = time.monotonic() + 60
    while setup.worker.get("/ready")[1].get("status") != "broker-unreachable":
        assert time.monotonic() < deadline, "the worker never saw its brokers go"
        time.sleep(0.2)
    status, body, headers = post_line(setup.worker)
    assert (status, headers["Retry-After"]) == (503, "2"), body
    assert body["detail"].startswith("no live connection to any Kafka broker of 127.0.0.1:")
    assert body["detail"].endswith("; nothing was written")
