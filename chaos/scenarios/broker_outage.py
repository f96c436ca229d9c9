"""The only broker down for a while under load (single node: stopped, then started).

Pass: workers stay alive (same processes, no agent restart), ``/health`` answers 200
throughout, ``/ready`` answers 503 with a reason while the broker is away, processing
resumes by itself and the tables catch up with the ground truth.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from chaos.env import crashes, group, pid, reset, start, workdir
from chaos.load import SteadyLoad
from chaos.truth import drift, settle
from tests.support.kafka import LocalKafka
from tests.support.workers import Worker


def run(kafka: LocalKafka, down_s: float = 30.0, workers: int = 1) -> dict[str, Any]:
    reset(kafka)
    with group(kafka, workdir("broker-outage")) as members:
        started = [members.add(f"w{n}") for n in range(workers)]
        for worker in started:
            worker.wait_ready(240)
        pids = [pid(w) for w in started]
        load = SteadyLoad(kafka.bootstrap, 15.0, 6.0, seed=3).start()
        try:
            time.sleep(6)
            kafka.down()
            samples = _observe(started, down_s)
            start(kafka)
            back = time.monotonic()
            ready_after = [_ready_after(w, back) for w in started]
            time.sleep(5)
            load.pause()
            truth, tables, settle_s = settle(kafka.bootstrap, timeout=300)
        finally:
            load.stop()
        same = [pid(w) == p and w.alive() for w, p in zip(started, pids, strict=True)]
        agent_crashes = sum(crashes(w) for w in started)
    lost = sorted(load.stats.acked - truth.seqs)
    return {
        "broker_down_s": down_s,
        "workers": workers,
        "health_samples": len(samples),
        "health_200": sum(1 for s in samples if s["health"] == 200),
        "ready_samples": len(samples),
        "ready_503": sum(1 for s in samples if s["ready"] == 503),
        "ready_200_while_down": sum(1 for s in samples if s["ready"] == 200),
        "ready_unanswered": sum(1 for s in samples if s["ready"] is None),
        "ready_reasons": dict(Counter(s["reason"] for s in samples if s["reason"])),
        "ready_again_after_s": ready_after,
        "workers_same_process": all(same),
        "agent_crashes": agent_crashes,
        "records_sent": load.stats.sent,
        "records_acked": len(load.stats.acked),
        "records_failed": load.stats.failed,
        "acked_but_lost": len(lost),
        "catch_up_s": round(settle_s, 1),
        "drift": drift(truth, tables).as_dict(),
    }


def _observe(workers: list[Worker], seconds: float) -> list[dict[str, Any]]:
    """Ask every worker /health and /ready once a second while the broker is down."""
    samples: list[dict[str, Any]] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for worker in workers:
            samples.append(_sample(worker))
        time.sleep(1.0)
    return samples


def _sample(worker: Worker) -> dict[str, Any]:
    try:
        health, _ = worker.get("/health", timeout=3.0)
    except OSError:
        health = None
    try:
        ready, body = worker.get("/ready", timeout=3.0)
    except OSError:
        ready, body = None, None
    reason = None
    if isinstance(body, dict) and ready != 200:
        reason = str(body.get("reason") or body.get("status") or "")
    return {"health": health, "ready": ready, "reason": reason}


def _ready_after(worker: Worker, since: float) -> float | None:
    try:
        worker.wait_ready(240)
    except (TimeoutError, RuntimeError):
        return None
    return round(time.monotonic() - since, 1)
