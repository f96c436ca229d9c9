"""``python -m chaos [--quick] [--only NAME,...] [--lines-per-s N --events-per-s N]``:
run the scenarios and write the summary. Exit status: 0 when every scenario ran and none
failed (a missed target is not a failure), 1 when one failed, 2 when none failed but one
was skipped (it could not run here: nothing was shown).

Every scenario runs against its own local Kafka on loopback (single node on port 29192,
three nodes on 29292; ``CHAOS_KAFKA_PORT``/``CHAOS_KAFKA3_PORT``, or
``STREAMSTATE_TEST_KAFKA_PORT`` + 3500/3600, chaos/env.py) and its own worker processes,
which it stops by process id. The load is half of what the scenario's group sustained in a
calibration phase of the same run (chaos/load.py).
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from chaos import checks, report
from chaos.env import cluster
from chaos.load import LoadLevel, level
from chaos.suite import SCENARIOS
from tests.support.kafka import LocalKafka


def run_one(name: str, kafka: LocalKafka, quick: bool, load: LoadLevel) -> dict[str, Any]:
    scenario = SCENARIOS[name]
    started = time.monotonic()
    print(f"chaos: {name} ...", file=sys.stderr, flush=True)
    try:
        figures = scenario.run(kafka, quick, load)
    except Exception as error:
        traceback.print_exc()
        return {
            "title": scenario.title,
            "how": scenario.how,
            "verdict": "fail",
            "headline": f"did not finish: {error!r}"[:300],
            "error": repr(error),
            "checks": [],
            "seconds": round(time.monotonic() - started, 1),
        }
    found = scenario.check(figures)
    result = {
        "title": scenario.title,
        "how": scenario.how,
        "verdict": checks.verdict(found, figures),
        "headline": scenario.headline(figures),
        "checks": [c.as_dict() for c in found],
        "notes": scenario.notes(figures),
        "figures": figures,
        "seconds": round(time.monotonic() - started, 1),
    }
    print(f"chaos: {name}: {result['verdict']}: {result['headline']}", file=sys.stderr)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m chaos", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="the CI-sized variant")
    parser.add_argument("--only", default="", help=f"comma-separated of {', '.join(SCENARIOS)}")
    parser.add_argument("--lines-per-s", type=float, help="offered text lines per second")
    parser.add_argument("--events-per-s", type=float, help="offered item events per second")
    parser.add_argument(
        "--out",
        type=Path,
        default=report.RESULTS,
        help="where summary.md and summary.json go (the docs follow only chaos/results)",
    )
    args = parser.parse_args(argv)
    names = [n for n in args.only.split(",") if n] or list(SCENARIOS)
    unknown = set(names) - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenarios: {', '.join(sorted(unknown))}")
    load = level(args.quick, args.lines_per_s, args.events_per_s)
    started, machine = time.monotonic(), report.machine()
    results: dict[str, Any] = {}
    for brokers in (1, 3):
        batch = [n for n in names if SCENARIOS[n].brokers == brokers]
        if not batch:
            continue
        with cluster("run" if brokers == 1 else "run3", brokers=brokers) as kafka:
            for name in batch:
                results[name] = run_one(name, kafka, args.quick, load)
    ordered = {n: results[n] for n in SCENARIOS if n in results}
    if args.only:  # keep the other scenarios' latest results
        ordered = {**report.previous(args.out), **ordered}
        ordered = {n: ordered[n] for n in SCENARIOS if n in ordered}
    run = {"seconds": round(time.monotonic() - started), "scenarios_run": names}
    mode = "quick" if args.quick else "full" if set(names) == set(SCENARIOS) else "partial"
    path = report.write(ordered, mode, machine, load, run, args.out)
    print(f"chaos: wrote {path} and summary.json", file=sys.stderr)
    return exit_status([results[n]["verdict"] for n in names])


def exit_status(verdicts: list[str]) -> int:
    """1 if a scenario failed, else 2 if one was skipped, else 0."""
    if "fail" in verdicts:
        return 1
    return 2 if "skipped" in verdicts else 0


if __name__ == "__main__":
    sys.exit(main())
