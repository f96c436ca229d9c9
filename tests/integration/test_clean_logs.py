"""A clean start and a clean stop log no ERROR: a worker alone and a group of three,
against a fresh broker and a running one. A state the worker waits out (a group
coordinator not available yet on a fresh broker, a rebalance) is logged at INFO while
it is young; one that lasts is logged once at WARNING, naming what the worker waits
for (core/logs.py)."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from tests.support.kafka import TEST_PORT, LocalKafka, local_kafka
from tests.support.workers import Worker, stop_workers

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

#: A cluster of its own, beside the other modules' (ports follow TEST_PORT).
PORT = TEST_PORT + 3300
LEVEL = re.compile(r"^\[[^\]]+\] \[\d+\] \[([A-Z]+)\] ")
STILL_WAITING = "still waiting for the group coordinator"


def levels(worker: Worker, *wanted: str) -> list[str]:
    """The worker's log lines at any of the levels ``wanted``."""
    return [
        line
        for line in worker.log_text().splitlines()
        if (found := LEVEL.match(line)) is not None and found.group(1) in wanted
    ]


def start_and_stop(kafka: LocalKafka, directory: Path, count: int) -> list[Worker]:
    """``count`` workers started at once, ready, then stopped with SIGTERM; none may
    need a kill."""
    workers = [Worker(kafka, directory / f"w{n}").start() for n in range(count)]
    try:
        for worker in workers:
            worker.wait_ready(300)
    finally:
        killed = stop_workers(workers)
    assert killed == [], f"not stopped by SIGTERM: {[w.datadir.name for w in killed]}"
    return workers


def errors_of(workers: list[Worker]) -> dict[str, list[str]]:
    found = {
        f"{w.datadir.parent.name}/{w.datadir.name}": levels(w, "ERROR", "CRITICAL") for w in workers
    }
    return {name: lines[:5] for name, lines in found.items() if lines}


def test_a_worker_alone_on_a_fresh_then_a_running_broker_logs_no_error(tmp_path: Path) -> None:
    with local_kafka("clean-logs", port=PORT) as kafka:
        fresh = start_and_stop(kafka, tmp_path / "fresh", 1)
        again = start_and_stop(kafka, tmp_path / "fresh", 1)  # the same worker, restarted
        three = start_and_stop(kafka, tmp_path / "running-three", 3)
    assert errors_of(fresh + again + three) == {}


def test_a_group_of_three_on_a_fresh_broker_logs_no_error(tmp_path: Path) -> None:
    with local_kafka("clean-logs", port=PORT) as kafka:
        three = start_and_stop(kafka, tmp_path / "fresh-three", 3)
        # On a fresh broker the coordinator keeps the workers waiting a while: that was
        # logged, at INFO.
        waited = [w for w in three if "Group Coordinator Request failed" in w.log_text()]
    assert errors_of(three) == {}
    assert waited, "no worker waited for the coordinator: the case was not exercised"


def test_a_coordinator_that_never_comes_is_one_warning_not_errors(tmp_path: Path) -> None:
    # One node cannot hold an offsets topic of three replicas: no group coordinator ever.
    unsatisfiable = ("offsets.topic.replication.factor=3",)
    with local_kafka("clean-logs", port=PORT, properties=unsatisfiable) as kafka:
        worker = Worker(
            kafka, tmp_path / "w0", extra_env={"STREAMSTATE_LOG_TRANSIENT_GRACE_S": "3"}
        ).start()
        try:
            deadline = time.monotonic() + 120
            while STILL_WAITING not in worker.log_text() and time.monotonic() < deadline:
                assert worker.alive(), worker.log_tail()
                time.sleep(0.5)
            time.sleep(5.0)  # the state goes on: no second warning
        finally:
            stop_workers([worker])
    warnings = levels(worker, "WARNING")
    assert len([line for line in warnings if STILL_WAITING in line]) == 1, warnings
    waits = [line for line in levels(worker, "INFO") if "Group Coordinator Request failed" in line]
    assert len(waits) >= 2
    assert errors_of([worker]) == {}
