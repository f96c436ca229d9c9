"""A copy that is restoring never answers "absent" for a key it may not have yet.

A worker starts on an empty data dir against a large word_counts changelog whose last
record is the key read; its HTTP port answers while it restores. Every read of that key
answers its value or 503 with Retry-After, never 404; a key the table does not hold is
503 while no restored active copy can say so, and 404 once one can."""

from __future__ import annotations

import asyncio
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaProducer

from core.topics import partition_for
from tests.support.kafka import TEST_PORT, local_kafka
from tests.support.workers import Worker, stop_workers

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

#: A cluster of its own, beside the other modules' (ports follow TEST_PORT).
PORT = TEST_PORT + 3700
CHANGELOG = "streamstate-word_counts-changelog"
NEEDLE = b"needle"
NEVER = "never-written"
#: Records before the needle in its changelog partition: a restore of some seconds.
FILLER_RECORDS = 1_500_000


def filler_key(partition: int) -> bytes:
    """A key of the needle's changelog partition that is not the needle."""
    return next(
        key
        for n in range(10_000)
        if partition_for(key := f"filler{n}".encode(), 8) == partition and key != NEEDLE
    )


async def _fill(bootstrap: str, partition: int) -> None:
    """FILLER_RECORDS updates of one key, then the needle, into one changelog partition,
    in record batches."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", max_batch_size=1 << 20)
    await producer.start()
    try:
        key, sent = filler_key(partition), []
        records = [(key, str(n).encode()) for n in range(FILLER_RECORDS)] + [(NEEDLE, b"42")]
        batch = producer.create_batch()
        for record_key, value in records:
            if batch.append(key=record_key, value=value, timestamp=None) is None:
                sent.append(await producer.send_batch(batch, CHANGELOG, partition=partition))
                batch = producer.create_batch()
                batch.append(key=record_key, value=value, timestamp=None)
        sent.append(await producer.send_batch(batch, CHANGELOG, partition=partition))
        await asyncio.gather(*sent)
    finally:
        await producer.stop()


@dataclass(frozen=True)
class Read:
    key: str
    status: int | None
    body: Any
    retry_after: str | None


def get(worker: Worker, path: str) -> tuple[int | None, Any, str | None]:
    """(status, JSON body, Retry-After); status None when the port does not answer."""
    try:
        with urllib.request.urlopen(worker.url + path, timeout=10) as answer:
            return answer.status, orjson.loads(answer.read()), None
    except urllib.error.HTTPError as error:
        return error.code, orjson.loads(error.read()), error.headers.get("Retry-After")
    except OSError:
        return None, None, None


def read_while_restoring(worker: Worker) -> list[Read]:
    """Read both keys and /ready over and over until a second after ready."""
    reads: list[Read] = []
    ready_at = None
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        assert worker.alive(), worker.log_tail()
        status, _, _ = get(worker, "/ready")
        for key in (NEEDLE.decode(), NEVER):
            reads.append(Read(key, *get(worker, f"/tables/word_counts/keys/{key}")))
        if status == 200:
            ready_at = ready_at or time.monotonic()
            if time.monotonic() - ready_at > 1.0:
                return reads
    raise AssertionError(f"not ready in 300 s: {worker.log_tail()}")


def test_a_restoring_worker_never_answers_absent_for_a_key_it_may_not_have(
    tmp_path: Path,
) -> None:
    partition = partition_for(NEEDLE, 8)
    with local_kafka("restoring-reads", port=PORT) as kafka:
        first = Worker(kafka, tmp_path / "first").start()
        try:
            first.wait_ready(300)  # creates the topics
        finally:
            stop_workers([first])
        asyncio.run(_fill(kafka.bootstrap, partition))
        worker = Worker(kafka, tmp_path / "empty").start()  # a lost disk: restores it all
        try:
            reads = read_while_restoring(worker)
        finally:
            stop_workers([worker])
    needle = [r for r in reads if r.key == NEEDLE.decode() and r.status is not None]
    restoring = [r for r in needle if r.status == 503 or r.body.get("replica") == "standby"]
    assert restoring, "no read answered while the worker restored: the case was not exercised"
    assert {r.status for r in needle} <= {200, 503}, [r for r in needle if r.status == 404]
    assert all(r.body["value"] == 42 for r in needle if r.status == 200)
    assert all(r.retry_after is not None for r in needle if r.status == 503)
    never = [r for r in reads if r.key == NEVER and r.status is not None]
    assert {r.status for r in never} <= {404, 503}
    not_active = [r.body for r in never if r.status == 404 and r.body["replica"] != "active"]
    assert not not_active, not_active[:3]
    assert (needle[-1].status, needle[-1].body["replica"]) == (200, "active")
    assert never[-1].status == 404
