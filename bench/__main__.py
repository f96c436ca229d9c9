"""Run the benchmarks and write bench/results/.

    python -m bench [--quick] [--scale F] [--only wordcount,iq,...] [--out DIR]

Full run (``make bench``): about half an hour on 2 cores. ``--quick``: a smoke run of a
few minutes with small sizes. ``BENCH_SCALE`` (or ``--scale``) multiplies the record
counts of either. The word count and inventory scenarios also run the Kafka Streams
baseline (bench/baselines/kstreams/), which needs ``mvn`` and a JDK 17 to be built.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench import data, machine, plots, report
from bench.config import RESULTS, WORK_DIR, Sizes, sizes
from bench.kafka import BenchKafka
from bench.procs import Worker
from bench.scenarios import (
    Outcome,
    batch,
    consistency,
    inventory,
    queries,
    restore,
    wordcount,
)

SCENARIOS = ("wordcount", "inventory", "batch", "restore", "iq", "consistency", "failover")


class Run:
    """The figures, notes and details gathered so far."""

    def __init__(self, only: set[str]) -> None:
        self.only = only
        self.started = time.monotonic()
        self.figures: dict[str, dict[str, Any]] = {}
        self.notes: dict[str, list[str]] = {}
        self.details: dict[str, Any] = {}

    def wanted(self, *sections: str) -> bool:
        return any(s in self.only for s in sections)

    def say(self, text: str) -> None:
        elapsed = time.monotonic() - self.started
        print(f"bench [{elapsed:6.0f} s] {text}", file=sys.stderr, flush=True)

    def record(self, section: str, outcome: Outcome) -> None:
        self.figures[section] = outcome.figures
        self.notes.setdefault(section, []).extend(outcome.notes)
        self.details[section] = outcome.details
        self.say(f"{section}: {outcome.figures}")

    def attempt(self, section: str, step: Callable[[], Outcome | None]) -> None:
        """Run one scenario; a failure is noted and the run goes on."""
        self.say(f"{section} ...")
        ticks = machine.cpu_ticks()
        try:
            outcome = step()
        except Exception as error:
            self.say(f"{section} failed: {error!r}")
            (WORK_DIR / "errors.log").open("a").write(traceback.format_exc())
            self.notes.setdefault(section, []).append(
                f"not measured: the scenario failed ({type(error).__name__}: "
                f"{str(error).splitlines()[0] if str(error) else ''})."
            )
            return
        if outcome is not None:
            self.record(section, outcome)
        stolen = machine.steal_share(ticks, machine.cpu_ticks())
        if stolen is not None:
            self.notes.setdefault(section, []).append(
                f"Steal time during this step: {stolen:.1%} of the machine's CPU time "
                "(`/proc/stat`: the hypervisor ran others on this machine's cores; figures "
                "of a step with much of it understate what the code does)."
            )


def stream_scenarios(run: Run, kafka: BenchKafka, size: Sizes) -> None:
    """Word count, inventory and the batch job on one cluster."""
    kafka.fresh()
    if run.wanted("wordcount"):
        run.attempt("wordcount", lambda: wordcount.run(kafka, size, WORK_DIR / "wordcount"))
    if run.wanted("inventory"):
        run.attempt("inventory", lambda: inventory.run(kafka, size, WORK_DIR / "inventory"))
    if run.wanted("batch"):
        run.attempt("batch", lambda: batch.run(kafka, size, WORK_DIR / "batch"))


def state_scenarios(run: Run, kafka: BenchKafka, size: Sizes) -> None:
    """Restore, then queries and failover on the restored table, on a second cluster."""
    kafka.fresh()
    workers: dict[str, Worker] = {}

    def restored() -> Outcome:
        outcome, workers["a"] = restore.run(kafka, size, WORK_DIR / "restore")
        return outcome

    def two_workers() -> tuple[Worker, Worker]:
        # The broker is fresh: a data dir left by an earlier run holds copies ahead of
        # its changelogs, which faust refuses to start from (ConsistencyError).
        if "a" not in workers:  # the restore did not run or failed: load the table anew
            restore.preload(kafka, size.restore_keys)
            shutil.rmtree(WORK_DIR / "restore" / "a", ignore_errors=True)
            workers["a"] = Worker(kafka.broker_url, WORK_DIR / "restore" / "a").start()
        shutil.rmtree(WORK_DIR / "restore" / "b", ignore_errors=True)
        workers["b"] = Worker(kafka.broker_url, WORK_DIR / "restore" / "b").start()
        for worker in workers.values():
            worker.wait_ready(size.restore_timeout_s)
        return workers["a"], workers["b"]

    routed: list[str] = []

    def iq() -> Outcome:
        a, b = two_workers()
        outcome, owned_by_b = queries.run_queries(a, b, size, WORK_DIR / "restore")
        routed.extend(owned_by_b)
        return outcome

    def read_your_writes() -> Outcome:
        a, b = (workers["a"], workers["b"]) if "b" in workers else two_workers()
        step = max(1, size.restore_keys // size.iq_sample_keys)
        sample = [data.counter_key(n) for n in range(0, size.restore_keys, step)]
        local = queries.wait_two_owners(a, b, sample, timeout=120)[a.url]
        return consistency.run(a, b, local, size, WORK_DIR / "restore")

    def failover() -> Outcome | None:
        if not routed:
            raise RuntimeError("no keys of the second worker (the queries step failed)")
        return queries.run_failover(workers["a"], workers["b"], routed, size)

    try:
        if run.wanted("restore"):
            run.attempt("restore", restored)
        if run.wanted("iq", "failover"):
            run.attempt("iq", iq)
        if run.wanted("consistency"):
            run.attempt("consistency", read_your_writes)
        if run.wanted("failover"):
            run.attempt("failover", failover)
    finally:
        for worker in workers.values():
            worker.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run of a few minutes")
    parser.add_argument("--scale", type=float, default=None, help="multiply record counts")
    parser.add_argument("--only", default=",".join(SCENARIOS), help="comma-separated scenarios")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    size = sizes(args.quick, args.scale)
    run = Run(set(args.only.split(",")))
    WORK_DIR.mkdir(parents=True, exist_ok=True)
    kafka = BenchKafka()
    facts = machine.facts(kafka.version())
    facts["mode"] = size.mode
    facts["sizes"] = asdict(size)
    run.say(f"{size.mode} run; Kafka on {kafka.bootstrap}; work under {WORK_DIR}")
    try:
        if run.wanted("wordcount", "inventory", "batch"):
            stream_scenarios(run, kafka, size)
        if run.wanted("restore", "iq", "consistency", "failover"):
            state_scenarios(run, kafka, size)
    finally:
        kafka.down()
    machine.finish(facts, time.monotonic() - run.started)
    summary = report.summary(facts, run.figures)
    args.out.mkdir(parents=True, exist_ok=True)
    made = plots.draw(run.details, args.out, run.figures)
    report.write(args.out, summary, run.notes, run.details, made)
    run.say(f"wrote {args.out}/summary.json, summary.md, {', '.join(made)}")
    print(report.table(summary))


if __name__ == "__main__":
    main()
