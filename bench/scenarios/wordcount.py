"""Word count: the project's worker under both guarantees against Kafka Streams under
both, the per-event faust baseline and the bare aiokafka ceiling, all over the same
preloaded lines of ``text-lines``, with a check that Kafka Streams counted the same."""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path
from typing import Any

from bench import console, data, kstreams
from bench.baselines import faust_wordcount
from bench.config import Sizes
from bench.kafka import BenchKafka, create_project_topics, produce, truncate
from bench.procs import Worker
from bench.progress import Progress, watch_group
from bench.scenarios import Outcome, runs
from bench.scenarios.runs import Measured
from bench.stats import instant_rates, steady_rate
from bench.tables import project_tables

TEXT_LINES = "text-lines"
REPARTITION = "streamstate-word_counts-repartition"
WORD_COUNTS = "word_counts"
AT_LEAST_ONCE, EXACTLY_ONCE = "at_least_once", "exactly_once"


def preload(kafka: BenchKafka, lines: int) -> float:
    """Write the lines; return the seconds it took."""
    started = time.monotonic()
    asyncio.run(create_project_topics(kafka.bootstrap))
    asyncio.run(produce(kafka.bootstrap, TEXT_LINES, data.text_lines(lines)))
    return time.monotonic() - started


def run_ceiling(kafka: BenchKafka, work: Path) -> dict[str, Any]:
    return runs.run_ceiling(
        "bench.baselines.aiokafka_wordcount",
        kafka.bootstrap,
        TEXT_LINES,
        work,
        "the aiokafka ceiling",
    )


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


def project_run(
    kafka: BenchKafka, sizes: Sizes, work: Path, guarantee: str, *, console: bool = False
) -> Measured:
    """The project's worker over the lines, from a clean state, then its word counts from
    the changelog; with ``console``, its console open in a browser all the while."""
    runs.reset_project(kafka)
    seen = ", console open" if console else ""
    label = f"the project worker ({guarantee}{seen})"
    measured, worker = runs.run_project(
        kafka,
        work / f"project-{guarantee}{'-console' if console else ''}",
        label,
        guarantee,
        runs.Topics(TEXT_LINES, (REPARTITION,)),
        sizes.wordcount_lines,
        sizes.wordcount_max_s,
        console=console,
    )
    try:
        measured.tables = asyncio.run(project_tables(kafka.bootstrap, [WORD_COUNTS]))
    finally:
        worker.stop()
    return measured


def kstreams_run(
    kafka: BenchKafka, sizes: Sizes, work: Path, guarantee: str, project: Measured | None
) -> Measured:
    """Kafka Streams over the same records, committing as often as the project did."""
    suffix = "" if guarantee == kstreams.AT_LEAST_ONCE else "-eos"
    commit_ms = kstreams.commit_interval_ms(project.commit_interval_ms if project else None)
    app = kstreams.KStreamsApp(
        "wordcount",
        kafka.bootstrap,
        f"bench-kstreams-wordcount{suffix}",
        guarantee,
        work,
        commit_ms,
    )
    return runs.run_kstreams(
        app,
        kafka,
        runs.Topics(TEXT_LINES, (app.repartition_topic("words"),)),
        sizes.wordcount_lines,
        sizes.wordcount_max_s,
    )


def console_cpu_note(closed: Measured | None, opened: Measured | None, lines: int) -> list[str]:
    """What the worker itself spent per line with its console open and closed: the
    browser runs on the same cores, so the rates alone cannot tell its share from the
    worker's."""
    if closed is None or opened is None or not closed.cpu_s or not opened.cpu_s:
        return []
    per = 1e6 / lines
    return [
        f"The worker's own CPU from its start until every line was processed: "
        f"{closed.cpu_s * per:.2f} s per million lines with the console closed, "
        f"{opened.cpu_s * per:.2f} s with it open ({opened.cpu_s / closed.cpu_s:.2f}x)."
    ]


def run(kafka: BenchKafka, sizes: Sizes, work: Path) -> Outcome:
    """Preload the lines, then run the ceiling, the faust baseline, the project under
    both guarantees and Kafka Streams under both, all over the same lines."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    lines = sizes.wordcount_lines
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
    project = runs.attempt(
        notes, "The project under at_least_once",
        lambda: project_run(kafka, sizes, work, AT_LEAST_ONCE),
    )  # fmt: skip
    watched = runs.attempt(
        notes, "The project with its console open",
        lambda: project_run(kafka, sizes, work, AT_LEAST_ONCE, console=True),
    )  # fmt: skip
    eos = runs.attempt(
        notes, "The project under exactly_once",
        lambda: project_run(kafka, sizes, work, EXACTLY_ONCE),
    )  # fmt: skip
    ks = runs.attempt(
        notes, "Kafka Streams at_least_once",
        lambda: kstreams_run(kafka, sizes, work, kstreams.AT_LEAST_ONCE, project),
    )  # fmt: skip
    ks_eos = runs.attempt(
        notes, "Kafka Streams exactly_once_v2",
        lambda: kstreams_run(kafka, sizes, work, kstreams.EXACTLY_ONCE, eos),
    )  # fmt: skip
    # Later scenarios on this cluster must not find unprocessed lines.
    asyncio.run(truncate(kafka.bootstrap, [TEXT_LINES, REPARTITION]))
    notes = [
        f"{lines:,} lines of ten words preloaded in {preload_s:.0f} s; 8 partitions.",
        "Rates come from the consumer groups' committed offsets, so start-up is excluded: "
        "lines after the first commit on text-lines over the time from that commit until every "
        "line is committed through both stages (text-lines and the repartition topic). The "
        "faust baseline's is over its measuring window. The project ran under at_least_once, "
        "then under exactly_once (PROCESSING_GUARANTEE), each time from a clean state (its "
        "internal topics deleted, its group rewound to the start of the lines); Kafka "
        "Streams under at_least_once and exactly_once_v2, each "
        "with an application id of its own. Between the two project runs, the project ran "
        "under at_least_once once more with its console (/ui) open in Debian's chromium "
        f"(bench/console.py: each view in turn, {console.VIEW_S:g} s each, as an operator "
        "watching it would; the browser is launched before the worker starts, so that the "
        "figure measures the console, not a browser's launch).",
        f"The aiokafka ceiling reads the lines {runs.CEILING_RUNS} times; the median read counts.",
        f"The faust baseline is measured over at most {sizes.faust_baseline_s:.0f} s "
        f"({baseline.done:,.0f} of {lines:,} lines processed): it is far too slow for all.",
        runs.kstreams_note(
            "the same word count (bench/baselines/kstreams/): the contract's "
            "tokens, groupBy word (one repartition record per word), count into a persistent "
            "RocksDB store with its changelog"
        ),
        *notes,
    ]
    notes += console_cpu_note(project, watched, lines)
    measured = [r for r in (project, watched, eos, ks, ks_eos) if r is not None]
    notes += [n for r in measured if (n := r.unfinished_note("lines")) is not None]
    notes += [n for n in (runs.commit_note([project, eos, ks, ks_eos]),) if n is not None]
    pairs = [(project, ks), (eos, ks_eos)]
    equal, check_notes, checks = runs.compare_runs(pairs)
    notes += check_notes
    return Outcome(
        figures={
            "events_per_s": project.rate if project else None,
            "eos_events_per_s": eos.rate if eos else None,
            "console_events_per_s": watched.rate if watched else None,
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
            "project_finished": project.progress.finished if project else None,
            "project_series": project.progress.series if project else [],
            "project_rates": instant_rates(project.progress.series) if project else [],
            "baseline_series": baseline.series,
            "baseline_rates": instant_rates(baseline.series),
            "ceiling": ceiling,
            "ceiling_rates": instant_rates(ceiling["series"]),
            "runs": {r.label: r.details() for r in measured},
            "kstreams_check": checks,
        },
    )
