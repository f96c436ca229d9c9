"""/ready and /metrics of a worker with a partition that cannot advance: they name it,
the input offset it is stuck at and why."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from fastapi.testclient import TestClient

from api.app import create_api
from core.settings import Settings
from tables.engine import TP, Engine
from tests.support.api import FixedMembership, worker_view
from tests.support.clock import Clock
from tests.unit.test_engine import Log, MemoryTable, offer_next
from tests.unit.test_refusals import FlakyConnector, engine_over, growing, write


def stalled_engine(clock: Clock) -> tuple[Engine, FlakyConnector]:
    """An engine whose partition 0 failed its cycle once; partition 1 moves on."""
    log = Log()
    write(log, [b"a=1", b"a=2"], partition=0)
    write(log, [b"b=1"], partition=1)
    connector = FlakyConnector(log, exactly_once=True)
    engine = engine_over(connector, growing(), {"t": MemoryTable("t")})

    async def go() -> None:
        while not engine.stalls:
            await offer_next(engine, connector, 10)

    asyncio.run(go())
    return engine, connector


def client(engine: Engine) -> TestClient:
    membership = FixedMembership(actives=frozenset({TP("streamstate-t-changelog", 0)}))
    worker = worker_view(Settings(broker_url="127.0.0.1:9"), engine, membership)
    return TestClient(create_api(replace(worker, inputs={})))


def test_a_short_stall_is_listed_and_the_worker_stays_ready(clock: Clock) -> None:
    engine, _ = stalled_engine(clock)
    answer = client(engine).get("/ready")
    assert answer.status_code == 200
    [stalled] = answer.json()["stalled"]
    assert stalled["partition"] == 0
    assert stalled["inputs"] == {"in": 0}
    assert stalled["error"] == "ConnectionError"


def test_a_partition_stalled_for_ten_seconds_makes_the_worker_not_ready(clock: Clock) -> None:
    engine, _ = stalled_engine(clock)
    clock.advance(10.0)
    answer = client(engine).get("/ready")
    assert answer.status_code == 503
    body = answer.json()
    assert body["status"] == "stalled"
    assert body["detail"].startswith("partition 0 has not advanced for 10 s, stuck at {'in': 0}")
    assert "the broker went away" in body["detail"]
    assert [s["partition"] for s in body["stalled"]] == [0]


def test_metrics_name_the_stalled_partition_its_error_and_offset(clock: Clock) -> None:
    engine, _ = stalled_engine(clock)
    clock.advance(3.0)
    text = client(engine).get("/metrics").text
    assert 'streamstate_partition_stalled{error="ConnectionError",partition="0"} 1.0' in text
    assert 'streamstate_partition_stalled_seconds{partition="0"} 3.0' in text
    assert 'streamstate_stalled_input_offset{partition="0",topic="in"} 0.0' in text
    assert 'streamstate_cycle_retries_total{cause="backoff"} 1.0' in text


def test_a_partition_that_moves_again_is_no_longer_listed(clock: Clock) -> None:
    engine, connector = stalled_engine(clock)
    connector.producer = super(FlakyConnector, connector).producer  # type: ignore[method-assign]
    clock.advance(60.0)

    async def go() -> None:
        await engine.tick()
        for _ in range(3):
            await offer_next(engine, connector, 10)

    asyncio.run(go())
    assert client(engine).get("/ready").json()["stalled"] == []


def test_a_cycle_waiting_on_kafka_for_ten_seconds_is_stalled_one_applying_is_listed(
    clock: Clock,
) -> None:
    engine, connector = stalled_engine(clock)
    connector.producer = super(FlakyConnector, connector).producer  # type: ignore[method-assign]
    task = engine.tasks[1]
    task.busy_since, task.busy_at = clock.now - 12.0, {TP("in", 1): 1}
    engine.stalls.clear()
    answer = client(engine).get("/ready")
    assert answer.status_code == 200
    [busy] = answer.json()["stalled"]
    assert (busy["partition"], busy["error"], busy["inputs"]) == (1, "Busy", {"in": 1})
    task.waiting = True
    answer = client(engine).get("/ready")
    assert answer.status_code == 503
    assert answer.json()["stalled"][0]["error"] == "Waiting"
    assert "waited for Kafka to take its records for 12 s" in answer.json()["detail"]
