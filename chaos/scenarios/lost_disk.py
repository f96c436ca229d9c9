"""Lost disk: a worker's data dir deleted while it is stopped; it restores from the
changelogs. Pass: every table read through the API is equal before and after, as soon
as the worker says it is ready, and it read every changelog record to get there.
"""

from __future__ import annotations

import re
import shutil
import time
from typing import Any

from chaos.env import crashes, group, scan, workdir
from chaos.lag import LagMonitor
from chaos.workload import Workload
from tests.support.kafka import LocalKafka
from tests.support.kafka_io import changelog_records, produce
from tests.support.workers import Worker

TABLES = ["word_counts", "inventory", "sales_by_category", "unsettled_sales"]
RESTORE = re.compile(r"restore (\d+) done: (\d+) changelog records in ([\d.]+) s")


def run(kafka: LocalKafka, lines: int = 1000, events: int = 400) -> dict[str, Any]:
    """The topics may hold earlier records: the tables are compared with themselves."""
    workload = Workload(17, "lost-disk")
    with group(kafka, workdir("lost-disk")) as members:
        worker = members.add("w0")
        worker.wait_ready(240)
        started = time.monotonic()
        monitor = LagMonitor(kafka.bootstrap, interval=0.5).start()
        try:
            _produce(kafka, workload, lines, events)
            # A quiet spell of the tables alone is not enough: on a loaded machine the
            # worker's first cycle can come later than that.
            if monitor.wait_caught_up(600.0, since=time.monotonic()) is None:
                raise TimeoutError("the group never consumed what was produced")
        finally:
            monitor.stop()
        _wait_stable(worker)
        processed_s = time.monotonic() - started
        before = {t: scan(worker, t) for t in TABLES}
        worker.stop()
        records = changelog_records(kafka.bootstrap)
        shutil.rmtree(worker.datadir)
        log_offset = len(worker.log_text())
        started = time.monotonic()
        worker.start()
        worker.wait_ready(600)
        ready_s = time.monotonic() - started
        after = {t: scan(worker, t) for t in TABLES}
        equal_at_ready = after == before
        equal_after_s = 0.0 if equal_at_ready else _wait_equal(worker, before, started)
        restores = RESTORE.findall(worker.log_text()[log_offset:])
        agent_crashes = crashes(worker)
    return {
        "lines": lines,
        "events": events,
        "keys": {t: len(v) for t, v in before.items()},
        "processing_s": round(processed_s, 1),
        "changelog_records": records,
        "records_restored": sum(int(r[1]) for r in restores),
        "restore_s": round(sum(float(r[2]) for r in restores), 2),
        "start_to_ready_s": round(ready_s, 1),
        "equal_at_ready": equal_at_ready,
        "equal_after_s": equal_after_s,
        "tables_differing": [t for t in TABLES if before[t] != after[t]],
        "agent_crashes": agent_crashes,
    }


def _produce(kafka: LocalKafka, workload: Workload, lines: int, events: int) -> None:
    now = int(time.time() * 1000)
    produce(kafka.bootstrap, "text-lines", [(None, r.value) for r in workload.next_lines(lines)])
    batch = workload.next_events(events, now)
    produce(kafka.bootstrap, "item-events", [(r.key, r.value) for r in batch])


def _wait_stable(worker: Worker, quiet_s: float = 6.0, timeout: float = 600.0) -> None:
    """Until no table read through the API changes for ``quiet_s``."""
    deadline = time.monotonic() + timeout
    last: dict[str, Any] | None = None
    since = time.monotonic()
    while time.monotonic() < deadline:
        now = {t: scan(worker, t) for t in TABLES}
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return
        time.sleep(1.5)
    raise TimeoutError("the tables never stopped changing")


def _wait_equal(worker: Worker, before: dict[str, Any], started: float) -> float | None:
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if {t: scan(worker, t) for t in TABLES} == before:
            return round(time.monotonic() - started, 1)
        time.sleep(2)
    return None
