"""Measured runs shared by the word count and inventory scenarios: the project's worker
under either guarantee, a Kafka Streams application under either, and the reset that
lets the project run twice over the same preloaded topics."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import orjson

from agents.schemas import SETTLED_SALES, SOURCE_TOPICS
from bench import kstreams
from bench.console import console_open
from bench.kafka import BenchKafka, create_project_topics, delete_topics, rewind_group
from bench.kstreams import KStreamsApp
from bench.procs import PROJECT_GROUP, Worker, run_module
from bench.progress import Progress, watch_group
from bench.stats import completion_rate, instant_rates, steady_rate
from bench.tables import compare
from core.topics import dlq_topic

MIB = 1024 * 1024
T = TypeVar("T")


def metric_value(text: str, name: str) -> float | None:
    """The value of an unlabelled metric in Prometheus' text format (counters may carry
    the ``_total`` suffix)."""
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] in (name, f"{name}_total"):
            return float(parts[1])
    return None


@dataclass
class Measured:
    """One run over the preloaded records: its progress, rate and peak memory."""

    label: str
    progress: Progress
    peak_rss_bytes: int | None
    tables: dict[str, Any] = field(default_factory=dict)
    #: The project's batch cycles (each one commit) during the run, from /metrics.
    cycles: float | None = None
    #: Kafka Streams' commit.interval.ms in the run.
    commit_ms: int | None = None
    #: The project worker's CPU seconds from its start until every record was processed.
    cpu_s: float | None = None

    @property
    def rate(self) -> float | None:
        """Records per second from the first commit on the source topic until every
        record was committed through every stage; over the measuring window if unfinished."""
        progress = self.progress
        if progress.finished:
            return completion_rate(progress.source_series, progress.total, progress.series[-1][0])
        rate = steady_rate(progress.series)
        return 0.0 if rate is None and progress.done == 0 else rate

    @property
    def peak_rss_mib(self) -> float | None:
        return None if self.peak_rss_bytes is None else self.peak_rss_bytes / MIB

    @property
    def commit_interval_ms(self) -> float | None:
        """The mean time between commits while the records were processed: the project's
        from its batch cycles, Kafka Streams' its commit.interval.ms."""
        if self.commit_ms is not None:
            return float(self.commit_ms)
        started = [t for t, v in self.progress.source_series if v > 0]
        if not self.cycles or not started or not self.progress.finished:
            return None
        return 1000 * (self.progress.series[-1][0] - started[0]) / self.cycles

    def details(self) -> dict[str, Any]:
        return {
            "batch_cycles": self.cycles,
            "cpu_s": self.cpu_s,
            "commit_interval_ms": self.commit_interval_ms,
            "finished": self.progress.finished,
            "events_per_s": self.rate,
            "peak_rss_mib": self.peak_rss_mib,
            "series": self.progress.series,
            "rates": instant_rates(self.progress.series),
            "committed": self.progress.committed,
            "ends": self.progress.ends,
        }

    def unfinished_note(self, unit: str) -> str | None:
        if self.progress.finished and self.rate is None:
            return (
                f"{self.label}: no rate, its first commit already covered all "
                f"{self.progress.total:,} {unit} (too few to measure)."
            )
        if self.progress.finished:
            return None
        return (
            f"{self.label} did not finish: {self.progress.done:,.0f} of "
            f"{self.progress.total:,} {unit} processed; its rate is over its measuring "
            f"window. Committed at the end: {self.progress.committed}, of {self.progress.ends}."
        )


@dataclass(frozen=True)
class Topics:
    """What a run reads: the measured source topic, the repartition topics its records go
    through (a record is processed once through them), and other source topics that must
    be consumed too."""

    source: str
    downstream: tuple[str, ...] = ()
    inputs: tuple[str, ...] = ()


def watch(
    kafka: BenchKafka,
    group: str,
    topics: Topics,
    total: int,
    max_s: float,
    alive: Callable[[], bool],
) -> Progress:
    return asyncio.run(
        watch_group(
            kafka.bootstrap,
            group,
            topics.source,
            list(topics.downstream),
            total,
            max_s,
            alive=alive,
            inputs=topics.inputs,
        )
    )


def run_project(
    kafka: BenchKafka,
    directory: Path,
    label: str,
    guarantee: str,
    topics: Topics,
    total: int,
    max_s: float,
    *,
    console: bool = False,
) -> tuple[Measured, Worker]:
    """One project worker (no standbys) until everything is processed; the worker is
    returned still running, so that its tables can be read, and must be stopped. With
    ``console``, the worker's console is open in a browser all the while (the browser
    is launched before the worker starts)."""
    env = {"TABLE_STANDBY_REPLICAS": "0", "PROCESSING_GUARANTEE": guarantee}
    worker = Worker(kafka.broker_url, directory, env=env)
    try:
        if console:
            viewer_log = directory.parent / f"{directory.name}-console.log"
            with console_open(worker.url, viewer_log) as viewer:
                worker.start()
                progress = watch(kafka, PROJECT_GROUP, topics, total, max_s, worker.alive)
                if viewer.poll() is not None:
                    raise RuntimeError(f"the console's browser stopped early ({viewer_log})")
        else:
            worker.start()
            progress = watch(kafka, PROJECT_GROUP, topics, total, max_s, worker.alive)
        cpu_s = worker.cpu_seconds()
        status, metrics = worker.get("/metrics")
        cycles = metric_value(metrics, "streamstate_batch_cycles") if status == 200 else None
        return Measured(label, progress, worker.peak_rss(), cycles=cycles, cpu_s=cpu_s), worker
    except RuntimeError as error:
        worker.stop()
        raise RuntimeError(
            f"{error} ({last_error(worker.log_text())}; {worker.log_path})"
        ) from None
    except BaseException:
        worker.stop()
        raise


def last_error(log: str) -> str:
    """The last ERROR line of a worker log and the exception it ended with, if any."""
    lines = log.splitlines()
    errors = [i for i, line in enumerate(lines) if "[ERROR]" in line or "[CRITICAL]" in line]
    if not errors:
        return "no error in its log"
    first = errors[0]
    raised = next(
        (
            line
            for line in lines[first + 1 : first + 60]
            if line and not line.startswith((" ", "Traceback"))
        ),
        "",
    )
    return f"{lines[first].split('] ', 3)[-1].strip()} {raised.strip()}".strip()


def reset_project(kafka: BenchKafka, timeout: float = 60.0) -> None:
    """Forget what the project computed, keep the source records: its internal topics
    (changelogs, repartition topics) and outputs are deleted and created anew, and its
    group reads the source topics from the start again. The workers must be stopped."""
    outputs = (SETTLED_SALES, *(dlq_topic(t) for t in SOURCE_TOPICS))
    asyncio.run(delete_topics(kafka.bootstrap, (f"{PROJECT_GROUP}-",), outputs))
    asyncio.run(create_project_topics(kafka.bootstrap))
    deadline = time.monotonic() + timeout
    while True:
        try:
            asyncio.run(rewind_group(kafka.bootstrap, PROJECT_GROUP, list(SOURCE_TOPICS)))
            return
        except Exception:  # the group still has a member that is leaving
            if time.monotonic() > deadline:
                raise
            time.sleep(1.0)


def run_kstreams(
    app: KStreamsApp,
    kafka: BenchKafka,
    topics: Topics,
    total: int,
    max_s: float,
) -> Measured:
    """One Kafka Streams application until everything is processed, then its tables."""
    app.start()
    try:
        progress = watch(kafka, app.group, topics, total, max_s, app.alive)
        tables = app.dump() if progress.finished else {}
    finally:
        app.stop()
    label = f"Kafka Streams ({app.guarantee})"
    return Measured(label, progress, app.peak_rss_bytes, tables, commit_ms=app.commit_ms)


#: How many times a ceiling reads its topic: one read takes a second or two, and one
#: sample that short moves by a third between runs on this machine.
CEILING_RUNS = 3


def run_ceiling(module: str, bootstrap: str, topic: str, work: Path, what: str) -> dict[str, Any]:
    """A ceiling baseline (``python -m module``) over ``topic``: its median read of
    ``CEILING_RUNS``, each read's output in ``work/ceiling-<i>.log``."""

    def once(i: int) -> dict[str, Any]:
        log = work / f"ceiling-{i}.log"
        status, out, _ = run_module(
            module, ["--bootstrap", bootstrap, "--topic", topic], timeout=900, log=log
        )
        if status != 0:
            raise RuntimeError(f"{what} exited {status}; see {log}")
        result: dict[str, Any] = orjson.loads(out.strip().splitlines()[-1])
        return result

    return median_run(once)


def median_run(run: Callable[[int], dict[str, Any]], runs: int = CEILING_RUNS) -> dict[str, Any]:
    """Run a baseline ``runs`` times (``run(i)``) and return the run with the median
    ``events_per_s``, with every run's rate under ``runs_events_per_s``."""
    results = [run(i) for i in range(runs)]
    ranked = sorted(results, key=lambda r: float(r["events_per_s"] or 0.0))
    median = dict(ranked[len(ranked) // 2])
    median["runs_events_per_s"] = [r["events_per_s"] for r in results]
    return median


def attempt(notes: list[str], what: str, step: Callable[[], T]) -> T | None:
    """Run one optional step; a failure becomes a note and None."""
    try:
        return step()
    except Exception as error:
        first = str(error).splitlines()[0] if str(error) else ""
        notes.append(f"{what} not measured: {type(error).__name__}: {first}")
        return None


def peak_mib(runs: list[Measured | None]) -> float | None:
    values = [r.peak_rss_mib for r in runs if r is not None and r.peak_rss_mib is not None]
    return max(values) if values else None


def kstreams_note(what: str) -> str:
    return (
        f"Kafka Streams {kstreams.kafka_version()} (the broker's version) runs {what}; one "
        "stream thread, default caching, commit.interval.ms equal to the project's mean "
        "commit interval in its run under the same guarantee (below), heap "
        f"{kstreams.HEAP}, its own application id per guarantee. Peak RSS: VmHWM of the "
        "worker's and the JVM's process just before each was stopped, the largest of the "
        "scenario's runs of each."
    )


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


def commit_note(runs: list[Measured | None]) -> str | None:
    """How often each run committed: the project once per batch cycle, Kafka Streams on
    its commit interval."""
    parts = [
        f"{r.label} every {r.commit_interval_ms:,.0f} ms"
        for r in runs
        if r is not None and r.commit_interval_ms is not None
    ]
    if not parts:
        return None
    return (
        "Commits: the project commits once per batch cycle (mean interval from its /metrics' "
        "batch cycles over the processing time), Kafka Streams every commit.interval.ms: "
        f"{'; '.join(parts)}."
    )
