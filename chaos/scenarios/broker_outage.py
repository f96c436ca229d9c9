"""The only broker killed under sustained load, down for a minute, then started again.

Pass: the workers keep their processes (no agent restart); ``/health`` answers 200
throughout; every ``/ready`` asked from the first second of the outage on answers 503
with a reason; processing resumes by itself once the broker is back; no acknowledged
record is lost and the tables equal the ground truth once caught up.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from chaos.env import kill_broker, reset, start, wait_ready, workdir
from chaos.load import LoadFigures, LoadLevel
from chaos.session import Session, through_a_broker_fault
from tests.support.kafka import LocalKafka
from tests.support.workers import Worker

GUARANTEE = "exactly_once"
#: Samples taken earlier than this after the kill may still see the broker: the
#: connections need a moment to notice it is gone.
FIRST_SECOND = 1.0


def run(
    kafka: LocalKafka,
    level: LoadLevel,
    down_s: float = 60.0,
    workers: int = 2,
    load_s: float = 8.0,
) -> dict[str, Any]:
    """The broker down for ``down_s`` after ``load_s`` of load; ``load_s`` more once back."""
    reset(kafka)
    work = workdir("broker-outage")
    session = Session(kafka, level, work, active_s=down_s + 30.0, seed=3)
    return through_a_broker_fault(
        session,
        work,
        workers,
        240.0,
        lambda started: _outage(kafka, session, started, down_s, load_s),
        PROCESSING_GUARANTEE=GUARANTEE,
    )


def _outage(
    kafka: LocalKafka, session: Session, workers: list[Worker], down_s: float, load_s: float
) -> dict[str, Any]:
    load = session.start_load()
    time.sleep(load_s)
    before = load.figures
    lag_before = session.monitor.lag_at(time.monotonic())
    kill_broker(kafka, 1)  # returns once the process is gone: the outage begins
    killed_at = time.monotonic()
    samples = _observe(workers, killed_at, down_s)
    start(kafka)  # returns once the broker answers
    back_at = time.monotonic()
    up_again = load.figures
    ready_again = [_ready_after(w, back_at) for w in workers]
    time.sleep(load_s)
    after = session.pause()
    paused = time.monotonic()
    assert session.offered_from is not None
    # While the only broker is down nothing can be acknowledged, and once it is back the
    # generator's own producer takes a while to reconnect: the load the group faced is
    # measured up to the outage; the stretches after it are reported beside it.
    before_outage = session.offered_from.until(before)
    while_up = before_outage + up_again.until(after)
    settled = session.settle()
    back = session.monitor.first_at_most(lag_before or 0, back_at)
    counted = [s for s in samples if s["after_s"] >= FIRST_SECOND]
    return {
        "broker_down_s": down_s,
        "samples": len(samples),
        "samples_from_first_second": len(counted),
        "health_200": sum(1 for s in samples if s["health"] == 200),
        "ready_503_with_reason": sum(1 for s in counted if s["ready"] == 503 and s["reason"]),
        "ready_200_while_down": sum(1 for s in samples if s["ready"] == 200),
        "ready_unanswered": sum(1 for s in samples if s["ready"] is None),
        "first_503_after_s": min(
            (s["after_s"] for s in samples if s["ready"] == 503), default=None
        ),
        "ready_reasons": dict(Counter(s["reason"] for s in samples if s["reason"])),
        "not_503_examples": [s for s in counted if s["ready"] != 503][:3],
        "ready_again_after_s": ready_again,
        "acked_before_outage": before.acked_total,
        "offered_before_outage": before_outage.since(LoadFigures()),
        "offered_while_up": while_up.since(LoadFigures()),
        "lag_before_kill": lag_before,
        "peak_lag": session.monitor.peak_lag(killed_at, settled.caught_up_at or time.monotonic()),
        "back_to_lag_before_s": None if back is None or back > paused else round(back - back_at, 1),
        "drain_after_pause_s": settled.drain_s,
        "drift": settled.drift.as_dict(),
        **session.losses(),
    }


def _observe(workers: list[Worker], since: float, seconds: float) -> list[dict[str, Any]]:
    """Ask every worker /health and /ready while the broker is down: four times a
    second in the first three seconds, twice a second after."""
    samples: list[dict[str, Any]] = []
    while time.monotonic() - since < seconds:
        for worker in workers:
            samples.append({"worker": worker.datadir.name, **_sample(worker, since)})
        time.sleep(0.25 if time.monotonic() - since < 3.0 else 0.5)
    return samples


def _sample(worker: Worker, since: float) -> dict[str, Any]:
    after = round(time.monotonic() - since, 2)
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
        reason = str(body.get("status") or "") + (
            f": {body['detail']}" if body.get("detail") else ""
        )
    return {"after_s": after, "health": health, "ready": ready, "reason": reason}


def _ready_after(worker: Worker, since: float) -> float | None:
    ready, _failure = wait_ready(worker, 240.0)
    return None if ready is None else round(ready - since, 2)
