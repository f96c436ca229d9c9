"""``python -m chaos [--quick] [--only NAME,...]``: run the scenarios, write the summary.

Every scenario runs against its own local Kafka on loopback (single node on port 29192,
three nodes on 29292) and its own worker processes, which it stops by process id.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from chaos import checks, report
from chaos.env import cluster
from chaos.scenarios import api_fuzz, bad_input, broker_loss, broker_outage, kill_worker, lost_disk
from chaos.scenarios.kill_worker import KillPlan
from tests.support.kafka import LocalKafka


@dataclass(frozen=True)
class Scenario:
    title: str
    how: str
    brokers: int
    run: Callable[[LocalKafka, bool], dict[str, Any]]
    check: Callable[[dict[str, Any]], list[checks.Check]]
    headline: Callable[[dict[str, Any]], str]
    notes: Callable[[dict[str, Any]], list[str]] = lambda r: []


def _kill(guarantee: str) -> Callable[[LocalKafka, bool], dict[str, Any]]:
    def run(kafka: LocalKafka, quick: bool) -> dict[str, Any]:
        plan = KillPlan(
            guarantee, kills=1 if quick else 5, workers=1 if quick else 2, batch_check=not quick
        )
        return kill_worker.run(kafka, plan)

    return run


def _kill_headline(r: dict[str, Any]) -> str:
    exact = "exact" if r["exact_after_every_kill"] else "**not exact**"
    return (
        f"{r['kills']} kills: {exact}; over-count per kill {r['over_count_per_kill']} words "
        f"(of {r['rounds'][-1]['words_produced']} produced in all), under-count "
        f"{r['under_count_total']}; clean stop adds drift: {r['clean_stop_adds_drift']}"
        + _batch_headline(r.get("batch_job"))
    )


def _batch_headline(batch: dict[str, Any] | None) -> str:
    if batch is None:
        return ""
    if not batch.get("ran"):
        return f"; nightly job did not run ({batch.get('why')})"
    return (
        f"; nightly job exit {batch['exit']}: {batch['word_keys_differing']} words and "
        f"{batch['stores_differing']} stores differ (measured wrong: "
        f"{batch['word_keys_wrong_measured']} and {batch['stores_wrong_measured']})"
    )


KILL_HOW = (
    "A producer thread writes text lines and item events at a steady rate (acks=all, "
    "idempotent). A worker is killed with SIGKILL at a random moment, started again on "
    "the same data dir 2 s later, the load goes on for 4 s, then pauses; the tables "
    "(latest value per key of the changelogs) are compared with the ground truth "
    "recomputed from every record of the source topics. The drift a round adds is that "
    "kill's over-count. The last round stops the worker with SIGTERM instead."
)
SCENARIOS: dict[str, Scenario] = {
    "kill_at_least_once": Scenario(
        "kill -9 of a worker under load, at_least_once",
        KILL_HOW,
        1,
        _kill("at_least_once"),
        checks.kill_worker,
        _kill_headline,
    ),
    "kill_exactly_once": Scenario(
        "kill -9 of a worker under load, exactly_once",
        KILL_HOW,
        1,
        _kill("exactly_once"),
        checks.kill_worker,
        _kill_headline,
    ),
    "broker_loss": Scenario(
        "kill -9 of one broker of three under load",
        "Three KRaft nodes (RF 3, min ISR 2), workers with TOPIC_REPLICATION_FACTOR=3, "
        "producer acks=all. One node is killed with SIGKILL under load, started again "
        "after the pause; acknowledged records are matched with the source topics by "
        "sequence number and the tables with the ground truth.",
        3,
        lambda kafka, quick: broker_loss.run(kafka, down_s=15.0 if quick else 20.0),
        checks.broker_loss,
        lambda r: (
            f"{r['acked_but_lost']} of {r['records_acked']} acked records lost; "
            f"{r['words_counted_while_broker_down']} words counted while the broker was "
            f"down; caught up in {r['catch_up_s']} s; drift {r['drift']['words_over']} "
            f"over / {r['drift']['words_under']} under"
        ),
    ),
    "broker_outage": Scenario(
        "the broker down for 30 s",
        "The single broker is stopped under load and started again after the pause; "
        "/health and /ready of each worker are asked once a second meanwhile.",
        1,
        lambda kafka, quick: broker_outage.run(kafka, down_s=15.0 if quick else 30.0),
        checks.broker_outage,
        lambda r: (
            f"/health 200 {r['health_200']}/{r['health_samples']}; /ready 503 "
            f"{r['ready_503']}/{r['ready_samples']} (200: {r['ready_200_while_down']}); "
            f"caught up {r['catch_up_s']} s after; lost {r['acked_but_lost']}; drift "
            f"{r['drift']['words_over']} over / {r['drift']['words_under']} under"
        ),
    ),
    "bad_input": Scenario(
        "bad input",
        "A generated corpus of malformed records of every kind on text-lines, item-events, "
        "payments and products, after a few valid ones; dead letters are matched to the "
        "corpus by their source-partition and source-offset headers; the tables' changelogs "
        "and the products catalogue are compared before and after.",
        1,
        lambda kafka, quick: bad_input.run(kafka),
        checks.bad_input,
        lambda r: (
            f"{r['in_dlq']}/{r['records']} in the DLQ ({r['in_dlq_pct']}%), "
            f"{r['agent_crashes']} agent restarts, tables changed: {r['tables_changed'] or 0}"
        ),
    ),
    "api": Scenario(
        "API: schemathesis and hostile requests",
        "Two workers. schemathesis generates valid and invalid requests for every "
        "operation of /openapi.json; then oversize keys, path traversal, forwarding-loop "
        "headers and spoofed forwarding targets (a trap listener counts connections).",
        1,
        lambda kafka, quick: api_fuzz.run(kafka, cases=200 if quick else 1000),
        checks.api_fuzz,
        lambda r: (
            f"{r['cases']} cases, {r['server_errors']} 5xx; {r['refusal_checks']} hostile "
            f"requests, {len(r['refusal_failures'])} not refused; trap connections "
            f"{r['trap_connections']}"
        ),
    ),
    "lost_disk": Scenario(
        "lost disk",
        "A worker processes a workload, its tables are read through the API, it is "
        "stopped, its data dir deleted, and it is started again.",
        1,
        lambda kafka, quick: lost_disk.run(
            kafka, lines=1000 if quick else 8000, events=400 if quick else 3000
        ),
        checks.lost_disk,
        lambda r: (
            f"{r['records_restored']}/{r['changelog_records']} changelog records restored "
            f"in {r['restore_s']} s (start to ready {r['start_to_ready_s']} s); equal at "
            f"ready: {r['equal_at_ready']}"
        ),
    ),
}


def run_one(name: str, kafka: LocalKafka, quick: bool) -> dict[str, Any]:
    scenario = SCENARIOS[name]
    started = time.monotonic()
    print(f"chaos: {name} ...", file=sys.stderr, flush=True)
    try:
        figures = scenario.run(kafka, quick)
    except Exception as error:
        traceback.print_exc()
        return {
            "title": scenario.title,
            "how": scenario.how,
            "verdict": "fail",
            "headline": f"did not finish: {error!r}"[:200],
            "error": repr(error),
            "checks": [],
            "seconds": round(time.monotonic() - started, 1),
        }
    found = scenario.check(figures)
    result = {
        "title": scenario.title,
        "how": scenario.how,
        "verdict": checks.verdict(found),
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
    args = parser.parse_args(argv)
    names = [n for n in args.only.split(",") if n] or list(SCENARIOS)
    unknown = set(names) - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenarios: {', '.join(sorted(unknown))}")
    results: dict[str, Any] = {}
    for brokers in (1, 3):
        batch = [n for n in names if SCENARIOS[n].brokers == brokers]
        if not batch:
            continue
        with cluster("run" if brokers == 1 else "run3", brokers=brokers) as kafka:
            for name in batch:
                results[name] = run_one(name, kafka, args.quick)
    ordered = {n: results[n] for n in names}
    if args.only:  # keep the other scenarios' latest results
        ordered = {**report.previous(), **ordered}
        ordered = {n: ordered[n] for n in SCENARIOS if n in ordered}
    path = report.write(ordered, "quick" if args.quick else "full")
    print(f"chaos: wrote {path} and summary.json", file=sys.stderr)
    return 0 if all(r["verdict"] != "fail" for r in ordered.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
