"""Restore: a table of many keys restored from its changelog into an empty data dir,
then a restart with the data dir intact."""

from __future__ import annotations

import asyncio
import re
import shutil
import threading
import time
from pathlib import Path
from typing import Any

from bench import data
from bench.config import Sizes
from bench.kafka import BenchKafka, create_project_topics, create_topic, produce
from bench.procs import Worker
from bench.scenarios import Outcome

CHANGELOG = "streamstate-word_counts-changelog"
RESTORE_LINE = re.compile(r"restore (\d+) done: (\d+) changelog records in ([\d.]+) s")


def restores_in(log: str) -> list[tuple[int, float]]:
    """(records, seconds) of every ``restore N done`` line of a worker log."""
    return [(int(m[2]), float(m[3])) for m in RESTORE_LINE.finditer(log)]


def preload(kafka: BenchKafka, keys: int) -> float:
    started = time.monotonic()
    asyncio.run(create_project_topics(kafka.bootstrap))
    asyncio.run(create_topic(kafka.bootstrap, CHANGELOG, {"cleanup.policy": "compact"}))
    asyncio.run(produce(kafka.bootstrap, CHANGELOG, data.counter_records(keys)))
    return time.monotonic() - started


class ReadyPoller(threading.Thread):
    """Samples ``/ready`` restore progress while a worker recovers (for the plot)."""

    def __init__(self, worker: Worker, total: int) -> None:
        super().__init__(daemon=True)
        self.worker, self.total = worker, total
        self.series: list[tuple[float, float]] = []
        self.stop_event = threading.Event()

    def run(self) -> None:
        while not self.stop_event.is_set():
            status, body = self.worker.get("/ready", timeout=2.0)
            now = time.monotonic() - self.worker.started_at
            if status == 200:
                self.series.append((now, float(self.total)))
                return
            if isinstance(body, dict) and status == 503:
                # "progress" is null until the worker's tables have started
                partitions = (body.get("progress") or {}).get("partitions") or {}
                remaining = sum(
                    p.get("remaining") or 0 for k, p in partitions.items() if CHANGELOG in k
                )
                if partitions:
                    self.series.append((now, float(max(0, self.total - remaining))))
            self.stop_event.wait(0.5)


def run(kafka: BenchKafka, sizes: Sizes, work: Path) -> tuple[Outcome, Worker]:
    """Full restore, then a restart; returns the still running worker for the next scenario."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    keys = sizes.restore_keys
    preload_s = preload(kafka, keys)
    worker = Worker(kafka.broker_url, work / "a")
    poller = ReadyPoller(worker, keys)
    worker.start()
    poller.start()
    first_ready_s = worker.wait_ready(sizes.restore_timeout_s)
    poller.stop_event.set()
    restores = restores_in(worker.log_text())
    records, seconds = max(restores, default=(0, 0.0))
    peak = worker.peak_rss()
    worker.stop()
    worker.start()
    restart_ready_s = worker.wait_ready(sizes.restore_timeout_s, interval=0.05)
    restart = restores_in(worker.log_text())[len(restores) :]
    notes = [
        f"{keys:,} keys written to {CHANGELOG} in {preload_s:.0f} s; a worker with an empty "
        f"data dir was ready {first_ready_s:.1f} s after its start.",
        "records_per_s is the worker's own log line `restore N done: X changelog records in "
        "S s` (the restore of the first assignment).",
        "peak_rss_mib: the worker's peak resident set (VmHWM) once it held the restored "
        "table, before its restart.",
        "restart_ready_s: from the process start to the first `/ready` 200, data dir intact "
        f"(the restart's restore read {sum(r for r, _ in restart):,} records).",
    ]
    details: dict[str, Any] = {
        "keys": keys,
        "restored_records": records,
        "restore_seconds": seconds,
        "first_ready_s": first_ready_s,
        "series": poller.series,
        "restart_restores": restart,
    }
    figures = {
        "records_per_s": records / seconds if seconds > 0 else None,
        "restart_ready_s": restart_ready_s,
        "keys": keys,
        "peak_rss_mib": None if peak is None else peak / 1024**2,
    }
    return Outcome(figures, notes, details), worker
