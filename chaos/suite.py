"""The scenarios of ``make chaos``: how each runs at full and CI size, what it checks,
and the line the summary gives it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from statistics import median
from typing import Any

from chaos import checks
from chaos.load import LoadLevel
from chaos.scenarios import (
    api_fuzz,
    bad_input,
    broker_loss,
    broker_outage,
    disk,
    kill_worker,
    lost_disk,
    refusals,
    scale,
)
from chaos.scenarios.kill_worker import KillPlan
from chaos.scenarios.scale import ScalePlan
from tests.support.kafka import LocalKafka

Figures = dict[str, Any]
Runner = Callable[[LocalKafka, bool, LoadLevel], Figures]


@dataclass(frozen=True)
class Scenario:
    title: str
    how: str
    brokers: int
    run: Runner
    check: Callable[[Figures], list[checks.Check]]
    headline: Callable[[Figures], str]
    notes: Callable[[Figures], list[str]] = field(default=lambda r: [])


def kill_plan(guarantee: str, quick: bool) -> KillPlan:
    """Full: 10 kills and a failover under exactly_once; 3 kills, a clean stop and the
    nightly job's cross-check under at_least_once. Quick: one kill, and the failover
    (exactly_once) or the clean stop (at_least_once)."""
    eos = guarantee == "exactly_once"
    return KillPlan(
        guarantee,
        kills=1 if quick else (10 if eos else 3),
        load_before_kill_s=(2.0, 4.0),
        load_after_ready_s=1.0,
        clean_stop=not eos,
        failover=eos,
        batch_check=not quick and not eos,
    )


def _kill(guarantee: str) -> Runner:
    return lambda kafka, quick, level: kill_worker.run(kafka, kill_plan(guarantee, quick), level)


def _scale(guarantee: str) -> Runner:
    """Full: 3 rounds with 10 s of load after each step; quick: 1 round, 4 s."""
    return lambda kafka, quick, level: scale.run(
        kafka,
        ScalePlan(guarantee, rounds=1 if quick else 3, hold_s=4.0 if quick else 10.0),
        level,
    )


def _refusal(fault: str, guarantee: str) -> Runner:
    return lambda kafka, quick, level: refusals.run(
        kafka, level, guarantee, fault, load_s=4.0 if quick else 10.0
    )


def _rate(load: Figures) -> str:
    """What was offered over wall time, with the generator's stalls and, when the level
    was calibrated, what the group sustained."""
    offered = (
        f"{load.get('offered_lines_per_s') or 0:,} lines/s + "
        f"{load.get('offered_events_per_s') or 0:,} item events/s offered"
    )
    calibration = load.get("calibration")
    if calibration:
        offered += (
            f" (sustained {calibration['sustained_lines_per_s']:,} + "
            f"{calibration['sustained_events_per_s']:,})"
        )
    if load.get("stalled_s"):
        offered += f", generator stalled {load['stalled_s']:g} s"
    return offered


def _processed(rounds: list[Figures]) -> str:
    lines = [r["processed_lines_per_s"] for r in rounds if r.get("processed_lines_per_s")]
    events = [r["processed_events_per_s"] for r in rounds if r.get("processed_events_per_s")]
    if not lines or not events:
        return "processed: no samples"
    return f"processed {median(lines):,.0f} lines/s + {median(events):,.0f} events/s (median round)"


def _seconds(values: list[Any]) -> str:
    found = [v for v in values if v is not None]
    return f"{median(found):.1f} s median, {max(found):.1f} s max" if found else "none"


def _kill_headline(r: Figures) -> str:
    exact = "every table exact" if r["exact_after_every_kill"] else "**not exact**"
    over = {k: sum(v) for k, v in r["over_count_per_kill"].items() if sum(v)}
    failover = r.get("failover")
    gone = "not run" if failover is None else f"{failover.get('seconds_to_active')} s"
    return (
        f"{r['kills']} kills over {r['workers']} workers at {_rate(r['load'])}, "
        f"{_processed(r['rounds'])}: {exact}; over-count {over or 0}, under-count "
        f"{sum(r['under_count_total'].values())}; restart to ready "
        f"{_seconds(r['restart_to_ready_s'])}; failover {gone}, reads failed "
        f"{r['reads_failed_during_kills']}/{r['reads_during_kills']} during kills"
    )


#: The phases of a restart the notes give, in order (chaos.env.log_phases).
RESTART_PHASES = (
    "start_to_first_log_s",
    "first_log_to_joined_s",
    "joined_to_assigned_s",
    "assigned_to_recovering_s",
    "recovering_to_restored_s",
    "restored_to_recovered_s",
)


def _kill_notes(r: Figures) -> list[str]:
    notes = []
    kills = [row for row in r["rounds"] if row["fault"] == "kill9"]
    phases = {
        name: median(found)
        for name in RESTART_PHASES
        if (found := [row[name] for row in kills if row.get(name) is not None])
    }
    if phases:
        listed = ", ".join(f"{name.removesuffix('_s')} {s:.2f} s" for name, s in phases.items())
        evicted = sum(1 for row in kills if row.get("evicted"))
        cpu = [row["restart_cpu_s"] for row in kills if row.get("restart_cpu_s") is not None]
        used = f" It used {median(cpu):.2f} s of CPU until ready (median)." if cpu else ""
        notes.append(
            f"Where a restart's time went (medians over the kills, from the worker's log; "
            f"then /ready answers 200): {listed}.{used} The restarted worker was removed from "
            f"the group by its peers (its port refused their probes) in {evicted} of "
            f"{len(kills)} kills. Worker logs: .cache/chaos/<port>/kill-<guarantee>/."
        )
    if r["reads_failed_during_kills"]:
        examples = [e for row in r["rounds"] for e in row.get("reads_failed_examples", [])]
        notes.append(f"Failed key reads during the kills, for example: {examples[:3]}.")
    return notes


def _loss_headline(r: Figures) -> str:
    return (
        f"node {r['killed_node']} (leading {r['leaders_before_kill'][str(r['killed_node'])]} "
        f"source partitions) killed for {r['broker_down_s']:g} s at {_rate(r['load'])}: "
        f"{r['acked_but_lost']} of {r['acked_records']:,} acked records lost; "
        f"{r['acked_while_down']:,} acked and {r['processed_while_down']} processed while "
        f"it was down; drained {r['drain_after_pause_s']} s after the pause; "
        f"{'exact' if r['drift']['exact'] else '**not exact**'}"
    )


def _outage_headline(r: Figures) -> str:
    return (
        f"{r['broker_down_s']:g} s down at {_rate(r['load'])}: /health 200 "
        f"{r['health_200']}/{r['samples']}; /ready 503 with a reason "
        f"{r['ready_503_with_reason']}/{r['samples_from_first_second']} from the first second "
        f"(first 503 after {r['first_503_after_s']} s); ready again after "
        f"{r['ready_again_after_s']} s; lost {r['acked_but_lost']}; "
        f"{'exact' if r['drift']['exact'] else '**not exact**'} after catch-up"
    )


def _disk_headline(r: Figures) -> str:
    if r.get("skipped"):
        return f"skipped: {r['skipped']}"
    report, offsets = r["report"], r["offsets"]
    over = {t: r["drift"][t]["over"] for t in checks.TABLES if r["drift"][t]["over"]}
    return (
        f"reported after {report.get('after_s')} s (/ready {report.get('ready')} "
        f"{report.get('status')}, engine_failed {report.get('metric')}); committed past the "
        f"stores {offsets['committed_past_store']}/{offsets['compared']} inputs "
        f"({offsets['records_store_lacked']} records the stores lacked), past the changelogs "
        f"{offsets['committed_past_changelog']}; after restart: "
        f"{'exact' if r['drift']['exact'] else 'not exact'}, over-count {over or 0}, "
        f"under-count {sum(r['drift'][t]['under'] for t in checks.TABLES)}; worker process "
        f"{'stayed up' if r['worker_alive_after_fault'] else '**exited**'}"
    )


def _disk_notes(r: Figures) -> list[str]:
    if r.get("skipped"):
        return []
    if r["guarantee"] == "exactly_once":
        return [
            "Under exactly_once a cycle's changelog records and its offsets are committed in "
            "one transaction before the store write, so the committed offsets may lie past "
            f"what the full store holds ({r['offsets']['committed_past_store']} inputs here): "
            "the changelog holds what the store lacks, and the restart restores it."
        ]
    return [
        "Under at_least_once the offsets are committed only after the store write, so "
        "they never pass what the store holds; the changelog may hold the failed cycle "
        "already, and the restart applies it again (an over-count at_least_once allows)."
    ]


KILL_HOW = (
    "A load generator process (chaos/loadgen.py) offers text lines, item events and their "
    "payments at fixed rates (record batches, acks=all, idempotent; a sequence number per "
    "record, each acknowledged batch in a ledger): half of what the group sustained in a "
    "calibration phase at the start of the scenario. Three workers; each round one of them "
    "is killed with SIGKILL at a random moment and started again at once on its data dir, "
    "the load goes on through the restart, then pauses: the group catches up (lag 0 on "
    "every topic it reads) and every table and settled-sales are compared with the truth "
    "recomputed from the source topics; what a round adds to a table's drift is that "
    "kill's over- or under-count. Key reads go through the live workers all along."
)
EOS_HOW = KILL_HOW + (
    " After the kills one worker is killed for good: the failover, timed until every "
    "sampled key is answered by an active copy on a survivor."
)
ALO_HOW = KILL_HOW + (
    " After the kills a round stops a worker with SIGTERM (the clean case); then the "
    "nightly job recomputes the tables from the topics and must find exactly the keys "
    "left wrong."
)
REFUSAL_TITLES = {
    "event_time": "events hours and years ahead of and behind the clock, under load",
    "state_too_large": "a store's inventory value outgrowing its changelog's max.message.bytes",
    "output_refused": "settled pairs refused by their topic (max.message.bytes lowered)",
}
SCENARIOS: dict[str, Scenario] = {
    "kill_exactly_once": Scenario(
        "kill -9 of workers under load, exactly_once",
        EOS_HOW,
        1,
        _kill("exactly_once"),
        checks.kill_worker,
        _kill_headline,
        _kill_notes,
    ),
    "kill_at_least_once": Scenario(
        "kill -9 of workers under load, at_least_once",
        ALO_HOW,
        1,
        _kill("at_least_once"),
        checks.kill_worker,
        _kill_headline,
        _kill_notes,
    ),
    "broker_outage": Scenario(
        "the only broker killed for 60 s under load",
        "One node, two workers (exactly_once). The broker is killed with SIGKILL under "
        "load and started again after the pause; /health and /ready of each worker are "
        "asked twice a second meanwhile.",
        1,
        lambda kafka, quick, level: broker_outage.run(
            kafka, level, down_s=10.0 if quick else 60.0, load_s=4.0 if quick else 8.0
        ),
        checks.broker_outage,
        _outage_headline,
    ),
    "disk_exactly_once": Scenario(
        "a worker's disk full under load, exactly_once",
        "Two workers (exactly_once); one keeps its data dir on a tmpfs of its own, which a "
        "filler file fills under load. Its /ready and /metrics are watched, the group's "
        "committed offsets compared with the positions its stores and the changelogs "
        "hold; the filler removed, it is restarted and the tables compared.",
        1,
        lambda kafka, quick, level: disk.run(kafka, level, "exactly_once", 4.0 if quick else 10.0),
        checks.disk,
        _disk_headline,
        _disk_notes,
    ),
    "disk_at_least_once": Scenario(
        "a worker's disk full under load, at_least_once",
        "As above, under at_least_once.",
        1,
        lambda kafka, quick, level: disk.run(kafka, level, "at_least_once", 4.0 if quick else 10.0),
        checks.disk,
        _disk_headline,
        _disk_notes,
    ),
    "bad_input": Scenario(
        "bad input",
        "A generated corpus of malformed records of every kind on text-lines, item-events, "
        "payments and products, after a few valid ones; dead letters are matched to the "
        "corpus by their source-partition and source-offset headers; the tables' changelogs "
        "and the products catalogue are compared before and after.",
        1,
        lambda kafka, quick, level: bad_input.run(kafka),
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
        lambda kafka, quick, level: api_fuzz.run(kafka, cases=200 if quick else 1000),
        lambda r: checks.api_fuzz(r, min_cases=200 if r["cases"] < 1000 else 1000),
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
        lambda kafka, quick, level: lost_disk.run(
            kafka, lines=1000 if quick else 8000, events=400 if quick else 3000
        ),
        checks.lost_disk,
        lambda r: (
            f"{r['records_restored']}/{r['changelog_records']} changelog records restored "
            f"in {r['restore_s']} s (start to ready {r['start_to_ready_s']} s); equal at "
            f"ready: {r['equal_at_ready']}"
        ),
    ),
    **{
        f"{fault}_{guarantee}": Scenario(
            f"{REFUSAL_TITLES[fault]}, {guarantee}",
            refusals.__doc__ or "",
            1,
            _refusal(fault, guarantee),
            refusals.check,
            refusals.headline,
        )
        for fault in refusals.FAULTS
        for guarantee in ("exactly_once", "at_least_once")
    },
    **{
        f"scale_{guarantee}": Scenario(
            f"scaling out to 3 workers and back to 2 under load, {guarantee}",
            scale.HOW,
            1,
            _scale(guarantee),
            checks.scale,
            scale.headline,
        )
        for guarantee in ("exactly_once", "at_least_once")
    },
    "broker_loss": Scenario(
        "kill -9 of the leading node of three under load",
        "Three KRaft nodes (RF 3, min ISR 2), two workers (exactly_once) with "
        "TOPIC_REPLICATION_FACTOR=3, the load produced with acks=all. The node leading the "
        "most source partitions is killed with SIGKILL under load and started again after "
        "the pause; the ledger of acknowledged batches is matched with the topics by offset "
        "and sequence number, and the tables with the ground truth.",
        3,
        lambda kafka, quick, level: broker_loss.run(kafka, level, down_s=15.0 if quick else 20.0),
        checks.broker_loss,
        _loss_headline,
    ),
}
