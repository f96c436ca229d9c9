"""Word count: the project's worker against the per-event faust baseline and the bare
aiokafka ceiling, all three over the same preloaded lines of ``text-lines``."""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path
from typing import Any

import orjson

from bench import data
from bench.baselines import faust_wordcount
from bench.config import Sizes
from bench.kafka import BenchKafka, create_project_topics, produce, truncate
from bench.procs import Worker, run_module
from bench.progress import Progress, watch_group
from bench.scenarios import Outcome
from bench.stats import completion_rate, instant_rates, steady_rate

PROJECT_GROUP = "streamstate"
TEXT_LINES = "text-lines"
REPARTITION = "streamstate-word_counts-repartition"


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


def run(kafka: BenchKafka, sizes: Sizes, work: Path) -> Outcome:
    """Preload the lines, then run the ceiling, the faust baseline and the project."""
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
    project = run_worker(
        kafka,
        Worker(kafka.broker_url, work / "project", env={"TABLE_STANDBY_REPLICAS": "0"}),
        PROJECT_GROUP,
        [REPARTITION],
        lines,
        sizes.wordcount_max_s,
    )
    # Later scenarios on this cluster must not find unprocessed lines.
    asyncio.run(truncate(kafka.bootstrap, [TEXT_LINES, REPARTITION]))
    notes = [
        f"{lines:,} lines of ten words preloaded in {preload_s:.0f} s; 8 partitions.",
        "A project worker was started and stopped once before, on the empty topics, so that "
        "its repartition topic exists: on a fresh cluster the first assignment ignores it "
        "('Ignoring missing topic').",
        "Project and faust baseline rates come from the consumer groups' committed offsets, "
        "so start-up is excluded. The project's rate is the lines after its first commit on "
        "text-lines (its split stage, in a group of its own) over the time from that commit "
        "until every line is committed through both stages (text-lines and the repartition "
        "topic); the faust baseline's is over its measuring window.",
        f"The faust baseline is measured over at most {sizes.faust_baseline_s:.0f} s "
        f"({baseline.done:,.0f} of {lines:,} lines processed): it is far too slow for all.",
    ]
    if not project.finished:
        notes.append(
            f"The project worker did not finish in {sizes.wordcount_max_s:.0f} s: "
            f"{project.done:,.0f} of {lines:,} lines processed; its rate is over that window. "
            f"At the end it had committed {project.committed.get(TEXT_LINES, 0):,} lines "
            f"split and {project.committed.get(REPARTITION, 0):,} of "
            f"{project.ends.get(REPARTITION, 0):,} repartition records counted."
        )
    if project.finished:
        rate = completion_rate(project.source_series, lines, project.series[-1][0])
    else:
        rate = steady_rate(project.series)
    if rate is None and project.done == 0:
        rate = 0.0  # the worker ran the whole window and counted nothing
    return Outcome(
        figures={
            "events_per_s": rate,
            "baseline_faust_events_per_s": steady_rate(baseline.series),
            "ceiling_aiokafka_events_per_s": ceiling["events_per_s"],
        },
        notes=notes,
        details={
            "lines": lines,
            "project_finished": project.finished,
            "project_series": project.series,
            "project_rates": instant_rates(project.series),
            "baseline_series": baseline.series,
            "baseline_rates": instant_rates(baseline.series),
            "ceiling": ceiling,
            "ceiling_rates": instant_rates(ceiling["series"]),
        },
    )
