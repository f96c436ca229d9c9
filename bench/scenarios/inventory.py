"""Inventory: store events and payments through the project's worker (stock per store,
sales per category and hour, the settling join) under both guarantees, beside Kafka
Streams under both and the bare consume+parse ceiling, all over the same preloaded
records, with a check that Kafka Streams' tables equal the project's."""

from __future__ import annotations

import asyncio
import functools
import shutil
import time
from pathlib import Path
from typing import Any

from agents.schemas import ITEM_EVENTS, PAYMENTS, PRODUCTS, SETTLED_SALES
from bench import data, kstreams
from bench.config import Sizes
from bench.kafka import BenchKafka, create_project_topics, produce
from bench.scenarios import Outcome, runs
from bench.scenarios.runs import Measured
from bench.stats import instant_rates
from bench.tables import project_tables, settled_pairs

SALES_REPARTITION = "streamstate-sales_by_category-repartition"
TABLES = ("inventory", "sales_by_category", "unsettled_sales")
AT_LEAST_ONCE, EXACTLY_ONCE = "at_least_once", "exactly_once"
HOUR_MS = 3_600_000
#: Event time of the preloaded events: two hours, ending ten minutes ago.
SPAN_MS = 2 * HOUR_MS
#: One event in this many names a sku in no catalogue (category "unknown").
UNKNOWN_EVERY = 100
DAY_MS = 24 * HOUR_MS


def preload(kafka: BenchKafka, events: int) -> tuple[float, int]:
    """The catalogue (a second version of one product in ten, half-way through the
    events' time), the store events and their payments; (seconds, payments)."""
    started = time.monotonic()
    clock = data.EventTime(int(time.time() * 1000) - SPAN_MS - 600_000, SPAN_MS, events)
    asyncio.run(create_project_topics(kafka.bootstrap))
    catalogue = data.catalogue()
    first, second = clock.start_ms - DAY_MS, clock.start_ms + SPAN_MS // 2
    asyncio.run(produce(kafka.bootstrap, PRODUCTS, data.product_records(catalogue), first))
    asyncio.run(produce(kafka.bootstrap, PRODUCTS, data.recategorised(catalogue), second))
    items = data.item_events(events, clock=clock, unknown_every=UNKNOWN_EVERY)
    asyncio.run(produce(kafka.bootstrap, ITEM_EVENTS, data.at_event_time(items)))
    payments = data.payments(events, clock, unknown_every=UNKNOWN_EVERY)
    asyncio.run(produce(kafka.bootstrap, PAYMENTS, data.at_event_time(payments)))
    return time.monotonic() - started, len(payments)


def run_ceiling(kafka: BenchKafka, work: Path) -> dict[str, Any]:
    return runs.run_ceiling(
        "bench.baselines.aiokafka_parse",
        kafka.bootstrap,
        ITEM_EVENTS,
        work,
        "the consume+parse ceiling",
    )


def project_run(kafka: BenchKafka, sizes: Sizes, work: Path, guarantee: str) -> Measured:
    """The project's worker over the events, from a clean state, then its tables and
    settled pairs."""
    runs.reset_project(kafka)
    measured, worker = runs.run_project(
        kafka,
        work / f"project-{guarantee}",
        f"the project worker ({guarantee})",
        guarantee,
        runs.Topics(ITEM_EVENTS, (SALES_REPARTITION,), (PAYMENTS,)),
        sizes.inventory_events,
        sizes.inventory_max_s,
    )
    try:
        if measured.progress.finished:
            measured.tables = asyncio.run(project_tables(kafka.bootstrap, TABLES))
            pairs = asyncio.run(settled_pairs(kafka.bootstrap, SETTLED_SALES))
            measured.tables["settled_sales"] = dict(pairs)
    finally:
        worker.stop()
    return measured


def kstreams_run(
    kafka: BenchKafka,
    sizes: Sizes,
    work: Path,
    guarantee: str,
    project: Measured | None,
    round_: int = 1,
) -> Measured:
    """Kafka Streams over the same records, committing as often as the project did; each
    round under its own application id, so that it starts from the first record."""
    suffix = "" if guarantee == kstreams.AT_LEAST_ONCE else "-eos"
    suffix += "" if round_ == 1 else f"-r{round_}"
    commit_ms = kstreams.commit_interval_ms(project.commit_interval_ms if project else None)
    app = kstreams.KStreamsApp(
        "inventory",
        kafka.bootstrap,
        f"bench-kstreams-inventory{suffix}",
        guarantee,
        work,
        commit_ms,
    )
    measured = runs.run_kstreams(
        app,
        kafka,
        runs.Topics(ITEM_EVENTS, (app.repartition_topic("sales"),), (PAYMENTS,)),
        sizes.inventory_events,
        sizes.inventory_max_s,
    )
    if measured.tables:
        topic = f"{app.application_id}-settled-sales"
        measured.tables["settled_sales"] = dict(asyncio.run(settled_pairs(kafka.bootstrap, topic)))
    return measured


def run(kafka: BenchKafka, sizes: Sizes, work: Path) -> Outcome:
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    events = sizes.inventory_events
    preload_s, payments = preload(kafka, events)
    notes: list[str] = []
    ceiling = runs.attempt(notes, "The consume+parse ceiling", lambda: run_ceiling(kafka, work))
    rounds = [
        measure_round(kafka, sizes, work, n, notes) for n in range(1, sizes.inventory_rounds + 1)
    ]
    project, eos, ks, ks_eos = (fastest([r[i] for r in rounds]) for i in range(4))
    notes = [
        f"{events:,} store events (80% sales, one in {UNKNOWN_EVERY} of an unknown sku) over "
        f"1,000 stores and two hours of event time, and {payments:,} payments for half of the "
        "sales (four in five within the 10-minute window, the others 11 to 15 minutes late), "
        "in the order of their ts; one product in ten changes category half-way through. "
        "Store events and payments carry their ts as record timestamps (Kafka Streams "
        "processes a task's records in timestamp order; the project reads ts from values). "
        f"Preloaded in {preload_s:.0f} s.",
        "Rates are item events per second from the first commit on item-events until every "
        "item event, every payment and every sales repartition record is committed (from "
        "the consumer groups' committed offsets; start-up excluded). The project ran under "
        "at_least_once, then under exactly_once (PROCESSING_GUARANTEE), each time from a "
        "clean state: its internal topics and outputs deleted, its group rewound to the "
        "start of the source topics.",
        rounds_note(rounds),
        "The ceiling is a bare aiokafka consumer reading item-events with getmany and "
        "parsing each value with orjson.loads (bench/baselines/aiokafka_parse.py); it reads "
        f"the topic {runs.CEILING_RUNS} times and the median read is the ceiling.",
        runs.kstreams_note(
            "the same pipeline (bench/baselines/kstreams/, Inventory.java): validation with the "
            "project's rules, stock per store in a Jackson JSON value, sales enriched from a "
            "global versioned products store as of their ts, re-keyed by category (one "
            "repartition record per sale) into 1-hour windows, and the contract's settling join "
            "with the Processor API"
        ),
        *notes,
    ]
    measured = [r for r in (project, eos, ks, ks_eos) if r is not None]
    every = [r for found in rounds for r in found]
    notes += [n for r in every if r is not None and (n := r.unfinished_note("item events"))]
    notes += [n for n in (runs.commit_note([project, eos, ks, ks_eos]),) if n is not None]
    equal, check_notes, checks = runs.compare_runs(
        [pair for r in rounds for pair in ((r[0], r[2]), (r[1], r[3]))]
    )
    notes += check_notes
    return Outcome(
        figures={
            "events_per_s": project.rate if project else None,
            "eos_events_per_s": eos.rate if eos else None,
            "ceiling_consume_parse_events_per_s": ceiling["events_per_s"] if ceiling else None,
            "baseline_kstreams_events_per_s": ks.rate if ks else None,
            "baseline_kstreams_eos_events_per_s": ks_eos.rate if ks_eos else None,
            "peak_rss_mib": runs.peak_mib([r for found in rounds for r in found[:2]]),
            "baseline_kstreams_peak_rss_mib": runs.peak_mib([r for f in rounds for r in f[2:]]),
            "kstreams_tables_equal": equal,
        },
        notes=notes,
        details={
            "events": events,
            "payments": payments,
            "finished": project.progress.finished if project else None,
            "series": project.progress.series if project else [],
            "rates": instant_rates(project.progress.series) if project else [],
            "ceiling": ceiling,
            "runs": {r.label: r.details() for r in measured},
            "rounds": [[None if r is None else r.rate for r in found] for found in rounds],
            "kstreams_check": checks,
        },
    )


#: The four runs of a round, in the order they run.
ROUND_RUNS = (
    "the project, at_least_once",
    "the project, exactly_once",
    "Kafka Streams, at_least_once",
    "Kafka Streams, exactly_once_v2",
)


def measure_round(
    kafka: BenchKafka, sizes: Sizes, work: Path, round_: int, notes: list[str]
) -> list[Measured | None]:
    """One round: the project under each guarantee, then Kafka Streams under each,
    committing as often as the project's run of the same round."""
    here = work / f"round-{round_}"
    here.mkdir(parents=True, exist_ok=True)
    what = [f"{name} (round {round_})" for name in ROUND_RUNS]
    project = runs.attempt(
        notes, what[0], functools.partial(project_run, kafka, sizes, here, AT_LEAST_ONCE)
    )
    eos = runs.attempt(
        notes, what[1], functools.partial(project_run, kafka, sizes, here, EXACTLY_ONCE)
    )
    ks = runs.attempt(
        notes,
        what[2],
        functools.partial(
            kstreams_run, kafka, sizes, here, kstreams.AT_LEAST_ONCE, project, round_
        ),
    )
    ks_eos = runs.attempt(
        notes,
        what[3],
        functools.partial(kstreams_run, kafka, sizes, here, kstreams.EXACTLY_ONCE, eos, round_),
    )
    found = [project, eos, ks, ks_eos]
    if sizes.inventory_rounds > 1:
        for measured in found:
            if measured is not None:
                measured.label = f"{measured.label}, round {round_}"
    return found


def fastest(candidates: list[Measured | None]) -> Measured | None:
    """The run with the highest rate (a run is only ever slowed by what else the machine
    does); a run without a rate only when none has one."""
    found = [r for r in candidates if r is not None]
    rated = [r for r in found if r.rate is not None]
    if rated:
        return max(rated, key=lambda r: r.rate or 0.0)
    return found[0] if found else None


def rounds_note(rounds: list[list[Measured | None]]) -> str:
    """Every run's rate, round by round, and which counts."""
    if len(rounds) == 1:
        return "One round: each of the four runs once."
    lines = []
    for i, name in enumerate(ROUND_RUNS):
        rates = [None if (r := found[i]) is None else r.rate for found in rounds]
        shown = ", ".join("n/a" if r is None else f"{r:,.0f}" for r in rates)
        lines.append(f"{name} {shown}")
    return (
        f"{len(rounds)} rounds, each running the project under at_least_once and "
        "exactly_once, then Kafka Streams under both (from its first record, under an "
        "application id of the round); the fastest run of each of the four is compared, "
        f"a run being only ever slowed by what else the machine does. Item events/s by "
        f"round: {'; '.join(lines)}."
    )
