"""Word count: the project's worker under both guarantees against Kafka Streams under
both, the per-event faust baseline and the bare aiokafka ceiling, all over the same
preloaded lines of ``text-lines``, with a check that Kafka Streams counted the same."""

from __future__ import annotations

import asyncio
import shutil
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import orjson

from bench import data, kstreams
from bench.baselines import faust_wordcount
from bench.config import Sizes
from bench.kafka import BenchKafka, create_project_topics, produce, truncate
from bench.procs import Worker, run_module
from bench.progress import Progress, watch_group
from bench.scenarios import Outcome, runs
from bench.scenarios.runs import Measured
from bench.stats import instant_rates, steady_rate
from bench.tables import compare, project_tables

TEXT_LINES = "text-lines"
REPARTITION = "streamstate-word_counts-repartition"
WORD_COUNTS = "word_counts"
AT_LEAST_ONCE, EXACTLY_ONCE = "at_least_once", "exactly_once"


def warm_up(kafka: BenchKafka, work: Path) -> float:
    """Start and stop a project worker once, so that it creates its internal topics.

    On a cluster without them, the first assignment ignores the repartition topics the
    worker creates during start-up ("Ignoring missing topic"), and ``words.count_words``
    then consumes nothing until the next rebalance. A deployed worker restarts with its
    topics in place; that is the case measured here.
    """
    worker = Worker(kafka.broker_url, work / "warm-up", env={"TABLE_STANDBY_REPLICAS": "0"})
    worker.start()
    try:
        return worker.wait_ready(300)
    finally:
        worker.stop()


def preload(kafka: BenchKafka, lines: int) -> float:
    """Write the lines; return the seconds it took."""
    started = time.monotonic()
    asyncio.run(create_project_topics(kafka.bootstrap))
    asyncio.run(produce(kafka.bootstrap, TEXT_LINES, data.text_lines(lines)))
    return time.monotonic() - started


def run_ceiling(kafka: BenchKafka, work: Path) -> dict[str, Any]:
    status, out, _ = run_module(
        "bench.baselines.aiokafka_wordcount",
        ["--bootstrap", kafka.bootstrap, "--topic", TEXT_LINES],
        timeout=900,
        log=work / "ceiling.log",
    )
    if status != 0:
        raise RuntimeError(f"aiokafka ceiling exited {status}; see {work / 'ceiling.log'}")
    result: dict[str, Any] = orjson.loads(out.strip().splitlines()[-1])
    return result


def run_worker(
    kafka: BenchKafka,
    worker: Worker,
    group: str,
    downstream: list[str],
    total: int,
    max_s: float,
    topic_groups: dict[str, str] | None = None,
) -> Progress:
    worker.start()
    try:
        return asyncio.run(
            watch_group(
                kafka.bootstrap,
                group,
                TEXT_LINES,
                downstream,
                total,
                max_s,
                alive=worker.alive,
                topic_groups=topic_groups,
            )
        )
    finally:
        worker.stop()


def project_run(kafka: BenchKafka, sizes: Sizes, work: Path, guarantee: str) -> Measured:
    """The project's worker over the lines, then its word counts from the changelog."""
    label = f"the project worker ({guarantee})"
    measured, worker = runs.run_project(
        kafka,
        work / f"project-{guarantee}",
        label,
        guarantee,
        TEXT_LINES,
        [REPARTITION],
        sizes.wordcount_lines,
        sizes.wordcount_max_s,
    )
    try:
        measured.tables = asyncio.run(project_tables(kafka.bootstrap, [WORD_COUNTS]))
    finally:
        worker.stop()
    return measured


def kstreams_run(kafka: BenchKafka, sizes: Sizes, work: Path, guarantee: str) -> Measured:
    suffix = "" if guarantee == kstreams.AT_LEAST_ONCE else "-eos"
    app = kstreams.KStreamsApp(
        "wordcount", kafka.bootstrap, f"bench-kstreams-wordcount{suffix}", guarantee, work
    )
    return runs.run_kstreams(
        app,
        kafka,
        TEXT_LINES,
        [app.repartition_topic("words")],
        sizes.wordcount_lines,
        sizes.wordcount_max_s,
    )


def run(kafka: BenchKafka, sizes: Sizes, work: Path) -> Outcome:
    """Preload the lines, then run the ceiling, the faust baseline, the project under
    both guarantees and Kafka Streams under both, all over the same lines."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    lines = sizes.wordcount_lines
    asyncio.run(create_project_topics(kafka.bootstrap))
    warm_up(kafka, work)
    preload_s = preload(kafka, lines)
    ceiling = run_ceiling(kafka, work)
    baseline = run_worker(
        kafka,
        Worker(kafka.broker_url, work / "faust-baseline", app="bench.baselines.faust_wordcount"),
        faust_wordcount.APP_ID,
        [],
        lines,
        sizes.faust_baseline_s,
    )
    notes: list[str] = []
    project = project_run(kafka, sizes, work, AT_LEAST_ONCE)

    def project_eos() -> Measured:
        runs.reset_project(kafka)
        warm_up(kafka, work)
        return project_run(kafka, sizes, work, EXACTLY_ONCE)

    eos = runs.attempt(notes, "The project under exactly_once", project_eos)
    ks = runs.attempt(
        notes, "Kafka Streams at_least_once",
        lambda: kstreams_run(kafka, sizes, work, kstreams.AT_LEAST_ONCE),
    )  # fmt: skip
    ks_eos = runs.attempt(
        notes, "Kafka Streams exactly_once_v2",
        lambda: kstreams_run(kafka, sizes, work, kstreams.EXACTLY_ONCE),
    )  # fmt: skip
    # Later scenarios on this cluster must not find unprocessed lines.
    asyncio.run(truncate(kafka.bootstrap, [TEXT_LINES, REPARTITION]))
    notes = [
        f"{lines:,} lines of ten words preloaded in {preload_s:.0f} s; 8 partitions.",
        "A project worker was started and stopped once before, on the empty topics, so that "
        "its internal topics exist (and again after the reset between the two guarantees).",
        "Rates come from the consumer groups' committed offsets, so start-up is excluded: "
        "lines after the first commit on text-lines over the time from that commit until every "
        "line is committed through both stages (text-lines and the repartition topic). The "
        "faust baseline's is over its measuring window. The project ran under at_least_once, "
        "then, its group rewound and its internal topics deleted, under exactly_once "
        "(PROCESSING_GUARANTEE); Kafka Streams under at_least_once and exactly_once_v2, each "
        "with an application id of its own.",
        f"The faust baseline is measured over at most {sizes.faust_baseline_s:.0f} s "
        f"({baseline.done:,.0f} of {lines:,} lines processed): it is far too slow for all.",
        *kstreams_notes(),
        *notes,
    ]
    measured = [r for r in (project, eos, ks, ks_eos) if r is not None]
    notes += [n for r in measured if (n := r.unfinished_note("lines")) is not None]
    pairs = [(project, ks), (eos, ks_eos)]
    equal, check_notes, checks = compare_runs(pairs)
    notes += check_notes
    return Outcome(
        figures={
            "events_per_s": project.rate,
            "eos_events_per_s": eos.rate if eos else None,
            "baseline_faust_events_per_s": steady_rate(baseline.series),
            "ceiling_aiokafka_events_per_s": ceiling["events_per_s"],
            "baseline_kstreams_events_per_s": ks.rate if ks else None,
            "baseline_kstreams_eos_events_per_s": ks_eos.rate if ks_eos else None,
            "peak_rss_mib": runs.peak_mib([project, eos]),
            "baseline_kstreams_peak_rss_mib": runs.peak_mib([ks, ks_eos]),
            "kstreams_tables_equal": equal,
        },
        notes=notes,
        details={
            "lines": lines,
            "project_finished": project.progress.finished,
            "project_series": project.progress.series,
            "project_rates": instant_rates(project.progress.series),
            "baseline_series": baseline.series,
            "baseline_rates": instant_rates(baseline.series),
            "ceiling": ceiling,
            "ceiling_rates": instant_rates(ceiling["series"]),
            "runs": {r.label: r.details() for r in measured},
            "kstreams_check": checks,
        },
    )


def kstreams_notes() -> list[str]:
    return [
        "Kafka Streams "
        f"{kstreams.kafka_version()} (the broker's version) runs the same word count "
        "(bench/baselines/kstreams/): the contract's tokens, groupBy word (one repartition "
        "record per word), count into a persistent RocksDB store with its changelog; one "
        f"stream thread, default caching, commit.interval.ms {kstreams.COMMIT_MS}, heap "
        f"{kstreams.HEAP}. Peak RSS: VmHWM of the worker's and the JVM's process just before "
        "each was stopped, the larger of the two runs.",
    ]


def compare_runs(
    pairs: list[tuple[Measured | None, Measured | None]],
) -> tuple[bool | None, list[str], dict[str, Any]]:
    """Each Kafka Streams run's tables against the project's under the same guarantee:
    (all equal, or None when nothing was compared; notes; the differences)."""
    notes: list[str] = []
    checks: dict[str, Any] = {}
    verdicts: list[bool] = []
    for ours, theirs in pairs:
        if ours is None or theirs is None or not ours.tables or not theirs.tables:
            continue
        differences = compare(ours.tables, theirs.tables)
        verdicts.append(all(d.equal for d in differences.values()))
        checks[theirs.label] = {name: asdict(d) for name, d in differences.items()}
        described = "; ".join(
            f"{name}: {d.describe('the project', 'Kafka Streams')}"
            for name, d in differences.items()
        )
        verdict = "equal" if verdicts[-1] else "**different**"
        notes.append(f"Tables of {theirs.label} against {ours.label}: {verdict}. {described}.")
    return (all(verdicts) if verdicts else None), notes, checks
