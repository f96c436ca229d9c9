"""kill -9 of a worker under continuous load, repeated; then a clean stop for contrast.

Each round: the producer keeps writing while a worker is killed with SIGKILL and started
again on the same data dir; then the producer pauses, the tables settle, and the drift
against the ground truth (computed from the source topics) is measured. The drift a round
adds is that kill's over-count (or under-count). A final round stops the worker with
SIGTERM instead: the guarantee's exact case. With ``batch_check``, the nightly job then
runs against the same topics, and its report is compared with the measured drift: it
must find exactly the words and stores that the rounds left wrong.
"""

from __future__ import annotations

import importlib.util
import random
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

import orjson

from chaos.env import crashes, group, reset, workdir
from chaos.load import SteadyLoad
from chaos.truth import Drift, drift, settle
from tests.support.kafka import ROOT, LocalKafka
from tests.support.workers import Worker


@dataclass(frozen=True)
class KillPlan:
    guarantee: str
    kills: int
    workers: int = 1
    lines_per_s: float = 20.0
    events_per_s: float = 8.0
    load_before_kill_s: tuple[float, float] = (4.0, 9.0)
    down_s: float = 2.0
    load_after_restart_s: float = 4.0
    clean_stop: bool = True
    seed: int = 7
    #: Run the nightly job at the end and compare its report with the measured drift.
    batch_check: bool = False


def run(kafka: LocalKafka, plan: KillPlan) -> dict[str, Any]:
    """Run the rounds of ``plan`` on ``kafka``, whose topics are deleted first."""
    reset(kafka)
    rng = random.Random(plan.seed)
    rounds: list[dict[str, Any]] = []
    env = {"PROCESSING_GUARANTEE": plan.guarantee}
    work = workdir(f"kill-{plan.guarantee}")
    batch: dict[str, Any] | None = None
    with group(kafka, work, **env) as workers:
        members = [workers.add(f"w{n}") for n in range(plan.workers)]
        for worker in members:
            worker.wait_ready(240)
        load = SteadyLoad(kafka.bootstrap, plan.lines_per_s, plan.events_per_s, plan.seed)
        load.start()
        previous: Drift | None = None
        try:
            kinds = ["kill9"] * plan.kills + (["sigterm"] if plan.clean_stop else [])
            for number, kind in enumerate(kinds, 1):
                victim = members[(number - 1) % len(members)]
                time.sleep(rng.uniform(*plan.load_before_kill_s))
                started = time.monotonic()
                if kind == "kill9":
                    victim.kill9()
                else:
                    victim.stop()
                time.sleep(plan.down_s)
                workers.restart(victim)
                failure = _wait_ready(victim)
                ready_s = time.monotonic() - started
                if failure is None:
                    time.sleep(plan.load_after_restart_s)
                load.pause()
                truth, tables, settle_s = settle(kafka.bootstrap, quiet_s=6.0 if failure else 12.0)
                now = drift(truth, tables)
                row = _round(number, kind, now, previous, ready_s, settle_s, truth)
                rounds.append({**row, "restart_failed": failure})
                previous = now
                if failure is not None:
                    break  # the worker cannot start again: the rounds end here
                load.resume()
        finally:
            load.stop()
        if plan.batch_check:
            truth, tables, _ = settle(kafka.bootstrap, quiet_s=12.0)
            batch = batch_report(kafka, work / "recompute", drift(truth, tables))
        agent_crashes = sum(crashes(w) for w in members)
    summary = _summary(plan, rounds, load, agent_crashes)
    if batch is not None:
        summary["batch_job"] = batch
    return summary


def batch_report(kafka: LocalKafka, out: Any, measured: Drift) -> dict[str, Any]:
    """Run ``python -m jobs.recompute`` on the topics; its findings next to ``measured``."""
    if importlib.util.find_spec("pyspark") is None:
        return {"ran": False, "why": "pyspark is not installed"}
    started = time.monotonic()
    command = [
        sys.executable,
        "-m",
        "jobs.recompute",
        "--bootstrap",
        kafka.bootstrap,
        "--out",
        str(out),
        "--settle-timeout",
        "60",
    ]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900)
    seconds = round(time.monotonic() - started, 1)
    report_path = out / "report.json"
    if done.returncode not in (0, 3) or not report_path.exists():
        tail = (done.stderr or done.stdout)[-400:]
        return {"ran": False, "why": f"exit {done.returncode}: {tail}", "seconds": seconds}
    report = orjson.loads(report_path.read_bytes())
    tables = report["tables"]

    def differing(name: str) -> int:
        entry = tables[name]
        return int(entry["mismatched"] + entry["missing_in_stream"] + entry["missing_in_batch"])

    return {
        "ran": True,
        "exit": done.returncode,
        "seconds": seconds,
        "cut_settled": report["cut_settled"],
        "word_keys_differing": differing("word_counts"),
        "stores_differing": differing("inventory"),
        "word_keys_wrong_measured": measured.keys_over + measured.keys_under,
        "stores_wrong_measured": measured.stores_wrong,
        "words_over_measured": measured.words_over,
    }


def _wait_ready(worker: Worker) -> str | None:
    """None once the restarted worker is ready; else why it is not (from its log)."""
    try:
        worker.wait_ready(300)
        return None
    except (RuntimeError, TimeoutError):
        reasons = [line for line in worker.log_text().splitlines() if "Crashed reason" in line]
        return (reasons[-1] if reasons else worker.log_tail(3))[-400:]


def _round(
    number: int,
    kind: str,
    now: Drift,
    previous: Drift | None,
    ready_s: float,
    settle_s: float,
    truth: Any,
) -> dict[str, Any]:
    before_over = previous.words_over if previous else 0
    before_under = previous.words_under if previous else 0
    return {
        "round": number,
        "fault": kind,
        "lines_produced": truth.lines,
        "events_produced": truth.events,
        "words_produced": now.words_produced,
        "words_counted": now.words_counted,
        "over_count_added": now.words_over - before_over,
        "under_count_added": now.words_under - before_under,
        "words_over_total": now.words_over,
        "words_under_total": now.words_under,
        "stores_wrong": now.stores_wrong,
        "exact": now.exact,
        "restart_to_ready_s": round(ready_s, 1),
        "settle_s": round(settle_s, 1),
    }


def _summary(
    plan: KillPlan, rounds: list[dict[str, Any]], load: SteadyLoad, agent_crashes: int
) -> dict[str, Any]:
    kills = [r for r in rounds if r["fault"] == "kill9"]
    clean = [r for r in rounds if r["fault"] == "sigterm"]
    over = [r["over_count_added"] for r in kills]
    return {
        "guarantee": plan.guarantee,
        "workers": plan.workers,
        "kills": len(kills),
        "load": {"lines_per_s": plan.lines_per_s, "events_per_s": plan.events_per_s},
        "records_sent": load.stats.sent,
        "records_failed": load.stats.failed,
        "over_count_per_kill": over,
        "over_count_per_kill_mean": round(sum(over) / len(over), 1) if over else None,
        "under_count_total": rounds[-1]["words_under_total"] if rounds else None,
        "exact_after_every_kill": all(r["over_count_added"] == 0 for r in kills)
        and all(r["under_count_added"] == 0 for r in kills),
        "inventory_exact_after_every_kill": all(r["stores_wrong"] == 0 for r in kills),
        "clean_stop_adds_drift": any(r["over_count_added"] or r["under_count_added"] for r in clean)
        if clean
        else None,
        "agent_crashes": agent_crashes,
        "restart_failures": [r["restart_failed"] for r in rounds if r.get("restart_failed")],
        "rounds": rounds,
    }
