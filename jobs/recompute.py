"""The nightly recompute: rebuild every table of the loaded pipelines from the retained
topics, reconcile them with the live tables and optionally repair the live ones.

    python -m jobs.recompute --bootstrap 127.0.0.1:9092 --out DIR [--repair] [--master local[*]]
                             [--python-env PYTHON] [--conf KEY=VALUE ...] [--views URI]
    python -m jobs.recompute --preflight-only [--master URL] [--python-env PYTHON]

The pipelines are those the workers load (``STREAMSTATE_PIPELINES`` and
``STREAMSTATE_EXTRA_PIPELINES``); their declarations say how each table is recomputed
(``jobs/plans.py``). Exit status: 0 when nothing differs, 3 when something differs, 2
when the executors lack what the job needs (the preflight), other non-zero on error.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO, TypeVar

if __package__ in (None, ""):  # run as a file, e.g. by spark-submit
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as sf

from core.settings import Settings
from jobs import compare, preflight
from jobs import io as kio
from jobs.corrections import CORRECTIONS_TOPIC, corrections_for
from jobs.cut import Cut, take_cut
from jobs.declared import Declared, GlobalData, JobSpec, declare
from jobs.globals import read_global_tables
from jobs.live import changelog_topic, live_tables
from jobs.rows import ROW_DDL, ROW_SCHEMA
from jobs.session import build_session, ship_modules
from jobs.stages import LOCAL_ROWS, Recomputation, recompute, write_views

EXIT_SAME, EXIT_DIFFERS, EXIT_ERROR, EXIT_PREFLIGHT = 0, 3, 1, 2
DAY_MS = 86_400_000
#: Windows that end within this long after their table's horizon are left out too: a
#: worker's clock may run ahead of the job's by that much when it expires windows.
EXPIRY_MARGIN_MS = 60_000
T = TypeVar("T")
#: The scheduler pools (jobs/fairscheduler.xml): the recompute and the live tables' read
#: run at once.
RECOMPUTE_POOL, LIVE_POOL = "recompute", "live"


@dataclass(frozen=True)
class Options:
    """What one run does."""

    bootstrap: str
    out: Path
    repair: bool = False
    master: str | None = "local[*]"
    app_id: str = "streamstate"
    settle_s: float = 60.0
    examples: int = 10
    max_event_bytes: int = 64 * 1024
    window_retention_ms: int = 7 * DAY_MS
    shuffle_partitions: int | None = None
    #: An interpreter every executor has, with the job's dependencies; None: the job's
    #: packed environment on a cluster (see jobs/pyenv.py).
    python_env: str | None = None
    #: Only start the session and check the executors (``--preflight-only``).
    preflight_only: bool = False
    #: Spark settings (``--conf KEY=VALUE``), set after the job's own.
    spark_conf: tuple[tuple[str, str], ...] = ()
    #: Where the Parquet views go (``--views``), when not under ``out``.
    views: str | None = None
    #: The pipeline modules, as the workers load them.
    modules: tuple[str, ...] = tuple(Settings.model_fields["pipelines"].default.split(","))
    #: Partitions of the topics when they do not exist yet.
    partitions: int = 8
    #: The executors' garbage collector thresholds (the workers' setting).
    gc_thresholds: tuple[int, int, int] = (100_000, 50, 100)
    #: Up to how many rows of stage 0, and of the live tables, the driver runs the later
    #: stages, the compare and the views itself (``--local-rows``; 0: never).
    local_rows: int = LOCAL_ROWS

    @property
    def views_at(self) -> Path | str:
        """The views' location: ``--views``, else ``out`` (the report stays in ``out``)."""
        return self.views or self.out

    def spec(self, partitions: int, clock_ms: int) -> JobSpec:
        return JobSpec(
            self.modules,
            partitions,
            self.max_event_bytes,
            self.window_retention_ms,
            self.app_id,
            clock_ms,
            self.gc_thresholds,
        )


class Progress:
    """Timestamped progress lines on stderr."""

    def __init__(self, stream: TextIO = sys.stderr) -> None:
        self.started = time.monotonic()
        self.stream = stream

    def __call__(self, message: str) -> None:
        elapsed = time.monotonic() - self.started
        print(f"recompute [{elapsed:7.1f}s] {message}", file=self.stream, flush=True)

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started


def topics_of(declared: Declared) -> tuple[list[str], list[str]]:
    """The topics the cut covers: the sources (global tables' included) and the
    changelogs of the compared tables."""
    plan = declared.plan
    sources = set(plan.sources) | {spec.topic for spec in plan.globals.values()}
    changelogs = [changelog_topic(declared.spec.app_id, name) for name in plan.tables]
    return sorted(sources), changelogs


async def _take_cut(options: Options, declared: Declared) -> Cut:
    sources, changelogs = topics_of(declared)
    return await asyncio.wait_for(
        take_cut(
            options.bootstrap,
            sources,
            changelogs,
            [CORRECTIONS_TOPIC],
            options.app_id,
            options.settle_s,
        ),
        timeout=options.settle_s + 120,
    )


def checked_session(
    options: Options, say: Progress, spark: Any = None, always: bool = False
) -> Any:
    """The job's session (``spark``, or a new one), its executors checked by the
    preflight when they are a cluster's (or ``always``); a new session is stopped when
    the check fails."""
    own = spark is None
    if own:
        spark = build_session(
            options.master,
            options.shuffle_partitions,
            options.python_env,
            dict(options.spark_conf),
            modules=options.modules,
        )
    try:
        ship_modules(spark, options.modules)
        if always or not str(spark.sparkContext.master).startswith("local"):
            preflight.run(spark, options.modules, say)
    except BaseException:
        if own:
            spark.stop()
        raise
    return spark


async def prepare(
    options: Options, declared: Declared, say: Progress, spark: Any = None
) -> tuple[Any, Cut, GlobalData]:
    """The checked session, the offset cut and the global tables as of the cut, at once:
    the JVM starts and the executors are checked while the cut waits for the workers to
    settle and the global tables are read. A failed preflight ends the wait."""

    async def cut_and_globals() -> tuple[Cut, GlobalData]:
        cut = await _take_cut(options, declared)
        found = await read_global_tables(
            options.bootstrap, declared.plan.globals, cut.sources, options.max_event_bytes
        )
        for name, data in found.items():
            say(f"global table {name}: {len(data)} keys as of the cut")
        return cut, found

    cutting = asyncio.ensure_future(cut_and_globals())
    try:
        ready = await asyncio.to_thread(checked_session, options, say, spark)
    except BaseException:
        cutting.cancel()
        with contextlib.suppress(BaseException):
            await cutting
        raise
    try:
        cut, found = await cutting
    except BaseException:
        if spark is None:
            ready.stop()
        raise
    return ready, cut, found


def partitions_of(cut: Cut, topics: list[str], default: int) -> int:
    """The partitions of the source topics (co-partitioned: the most any has)."""
    counts = [len(cut.sources[t]) for t in topics if cut.sources.get(t)]
    return max(counts, default=default)


def in_pool(spark: Any, name: str, work: Callable[..., T], *args: Any) -> T:
    """``work(*args)`` with the Spark jobs it submits in the scheduler pool ``name``:
    the pools share the cores fairly, so the live tables' read fills the cores the
    recompute leaves idle (its last tasks, the driver's work between stages)."""
    spark.sparkContext.setLocalProperty("spark.scheduler.pool", name)
    try:
        return work(*args)
    finally:
        spark.sparkContext.setLocalProperty("spark.scheduler.pool", None)


def horizons(options: Options, declared: Declared, cut: Cut) -> dict[str, int]:
    """Per windowed table, the time at or before which its windows are left out."""
    found = {}
    for name, spec in declared.plan.specs.items():
        if spec.window is not None:
            retention = spec.window.retention_ms
            kept = options.window_retention_ms if retention is None else retention
            found[name] = cut.taken_at_ms - kept + EXPIRY_MARGIN_MS
    return found


@dataclass
class Live:
    """The live tables' rows: cached in Spark (None: no changelog holds a record), and
    held by the driver too when there are at most ``local_rows``."""

    frame: DataFrame | None
    local: pa.Table | None

    def rows(self, spark: Any) -> DataFrame:
        if self.frame is None:
            empty: DataFrame = spark.createDataFrame([], ROW_DDL)
            return empty
        return self.frame

    def unpersist(self) -> None:
        if self.frame is not None:
            self.frame.unpersist()


def _live(spark: Any, options: Options, cut: Cut, declared: Declared, say: Progress) -> Live:
    frame = live_tables(spark, options.bootstrap, cut, options.app_id, declared.plan.specs)
    if frame is None:
        say("live tables: no changelog holds a record")
        return Live(None, ROW_SCHEMA.empty_table())
    frame = frame.persist()
    count = frame.count()
    say(f"live tables: {count} keys read from their changelogs")
    local = frame.toArrow().cast(ROW_SCHEMA) if count <= options.local_rows else None
    return Live(frame, local)


def views(
    spark: Any,
    options: Options,
    cut: Cut,
    declared: Declared,
    global_data: GlobalData,
    say: Progress,
) -> tuple[Recomputation, Live]:
    """The recomputed tables and the live ones (both cached), computed at once."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="live") as pool:
        live = pool.submit(in_pool, spark, LIVE_POOL, _live, spark, options, cut, declared, say)
        batch = in_pool(
            spark,
            RECOMPUTE_POOL,
            recompute,
            spark,
            options.bootstrap,
            cut,
            declared,
            global_data,
            say,
            options.local_rows,
        )
        return batch, live.result()


def _write_views(
    spark: Any, options: Options, declared: Declared, batch: Recomputation, say: Progress
) -> None:
    for name, count in write_views(batch, options.views_at, declared.plan.specs, spark).items():
        say(f"{name}: {count} keys recomputed")


def reconcile(
    spark: Any,
    options: Options,
    cut: Cut,
    declared: Declared,
    global_data: GlobalData,
    say: Progress,
) -> dict[str, Any]:
    """Build the report, the recomputed tables written as Parquet meanwhile (small jobs
    that mostly wait on each other); publish corrections with ``--repair``. Both sides
    held by the driver are compared by the driver."""
    batch, stream = views(spark, options, cut, declared, global_data, say)
    try:
        if batch.local is not None and stream.local is not None:
            _write_views(spark, options, declared, batch, say)
            rows = compare.diff_rows(batch.local, stream.local, horizons(options, declared, cut))
            return _report(options, cut, declared, batch, rows, say)
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="views") as pool:
            written = pool.submit(
                in_pool, spark, LIVE_POOL, _write_views, spark, options, declared, batch, say
            )
            report = in_pool(
                spark,
                RECOMPUTE_POOL,
                _compare,
                options,
                cut,
                declared,
                batch.frame(spark),
                stream.rows(spark),
                batch,
                say,
            )
            written.result()
        return report
    finally:
        batch.unpersist()
        stream.unpersist()


def _compare(
    options: Options,
    cut: Cut,
    declared: Declared,
    tables: DataFrame,
    stream: DataFrame,
    batch: Recomputation,
    say: Progress,
) -> dict[str, Any]:
    plan = declared.plan
    limits = horizons(options, declared, cut)
    differences = compare.diff(tables, stream, limits).persist()
    try:
        summary = compare.summarize(differences, list(plan.tables), options.examples)
        report = _report(options, cut, declared, batch, None, say, summary)
        if options.repair and any(compare.differs(e) for e in summary.values()):
            rows = differences.where(sf.col("status") != compare.EQUAL).toLocalIterator()
            report["corrections_published"] = _repair(options, rows, say)
    finally:
        differences.unpersist()
    return report


def _repair(options: Options, rows: Iterable[Any], say: Progress) -> int:
    published = kio.publish_corrections(options.bootstrap, corrections(rows))
    say(f"repair: published {published} corrections")
    return published


def _report(
    options: Options,
    cut: Cut,
    declared: Declared,
    batch: Recomputation,
    rows: list[dict[str, Any]] | None,
    say: Progress,
    summary: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The report; ``rows`` (compared by the driver) are summarized and, with
    ``--repair``, published as corrections."""
    plan = declared.plan
    if summary is None:
        assert rows is not None
        summary = compare.summarize_rows(rows, list(plan.tables), options.examples)
    for name, entry in summary.items():
        entry["recompute"] = plan.tables[name].as_json()
        say(f"{name}: compared {entry['keys_compared']} keys")
    published = 0
    if rows is not None and options.repair and any(compare.differs(e) for e in summary.values()):
        published = _repair(options, (r for r in rows if r["status"] != compare.EQUAL), say)
    return {
        "cut": cut.as_json(),
        "tables": summary,
        "not_recomputed": [entry.as_json() for entry in plan.not_recomputed],
        "pipelines": _pipelines(declared),
        "figures": batch.figures,
        "global_tables": batch.globals,
        "cut_taken_at_ms": cut.taken_at_ms,
        "cut_settled": cut.settled,
        "group_lag": cut.group_lag,
        "group_members": cut.group_members,
        "log_start": {t: {str(p): o for p, o in v.items()} for t, v in cut.log_start.items()},
        "window_horizons_ms": horizons(options, declared, cut),
        "corrections_published": published,
    }


def _pipelines(declared: Declared) -> dict[str, dict[str, Any]]:
    """Each loaded pipeline: the stage and mode it ran in, or why it did not run."""
    plan = declared.plan
    refused = {entry.pipeline: entry.reason for entry in plan.not_recomputed}
    found: dict[str, dict[str, Any]] = {}
    for name in plan.pipelines:
        if name in plan.modes:
            found[name] = {"stage": plan.stage_of(name), "mode": plan.modes[name]}
        elif name in refused:
            found[name] = {"not_recomputed": refused[name]}
        else:
            found[name] = {"skipped": "writes no table the job compares, feeds none"}
    return found


def corrections(rows: Iterable[Any]) -> Iterator[tuple[bytes, bytes]]:
    """The ``corrections`` records of the differing keys ``rows`` (rows of
    :data:`jobs.compare.DIFF_DDL`, or dicts of the same)."""
    for row in rows:
        start = row["window_start"]
        batch_window = (
            None if start is None or row["batch_end"] is None else (start, row["batch_end"])
        )
        live_window = (
            None if start is None or row["stream_end"] is None else (start, row["stream_end"])
        )
        yield from corrections_for(
            row["table"],
            row["key"],
            compare.loads(row["batch"]),
            compare.loads(row["stream"]),
            batch_window,
            live_window,
            # A live value that is no JSON gets no "expected": it is replaced whatever it is.
            live_readable=row["stream"] is None or compare.is_json(row["stream"]),
        )


def _short(value: Any, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def summary(report: dict[str, Any]) -> str:
    """The human summary printed on stdout."""
    cut = report["cut"]
    lines = ["streamstate recompute: batch vs live tables at the offset cut"]
    for topic, offsets in cut.items():
        if not topic.endswith("-changelog"):
            lines.append(
                f"  cut {topic}: {sum(offsets.values())} offsets in {len(offsets)} partitions"
            )
    if not report["cut_settled"]:
        lines.append(
            f"  WARNING: the workers had not caught up with the cut (lag {report['group_lag']});"
            " differences may be records still in flight"
        )
        if report.get("group_members") == 0:
            lines.append("  (no worker was running: the group had no member)")
    if report["log_start"]:
        lines.append(f"  WARNING: retention removed early source records: {report['log_start']}")
    header = ("table", "keys", "mismatched", "missing in stream", "missing in batch")
    lines.append("  {:<20}{:>10}{:>12}{:>19}{:>18}".format(*header))
    for name, entry in report["tables"].items():
        lines.append(
            f"  {name:<20}{entry['keys_compared']:>10}{entry['mismatched']:>12}"
            f"{entry['missing_in_stream']:>19}{entry['missing_in_batch']:>18}"
        )
        for example in entry["examples"][:3]:
            window = example.get("window")
            at = "" if window is None else f" window [{window['start']}, {window['end']})"
            lines.append(
                f"      {example['status']}: {example['key']!r}{at}"
                f" batch={_short(example['batch'])} stream={_short(example['stream'])}"
            )
        reason = entry.get("recompute", {}).get("order_dependent")
        if reason:
            lines.append(f"      may differ without an error: {reason}")
    for entry in report.get("not_recomputed", []):
        lines.append(f"  NOT RECOMPUTED: {entry['table']} ({entry['pipeline']}): {entry['reason']}")
    differs = any(compare.differs(e) for e in report["tables"].values())
    if report["corrections_published"]:
        lines.append(f"  repair: published {report['corrections_published']} corrections")
    lines.append(
        "  result: " + ("DIFFERENCES FOUND (exit 3)" if differs else "no differences (exit 0)")
    )
    return "\n".join(lines)


def run(options: Options, spark: Any = None) -> int:
    """One run; returns the exit status. ``spark`` reuses an existing session."""
    say = Progress()
    own_session = spark is None
    declared = declare(options.spec(options.partitions, int(time.time() * 1000)))
    say(f"{len(declared.loaded.pipelines)} pipelines loaded from {', '.join(options.modules)}")
    say(f"taking the offset cut on {options.bootstrap} (settle up to {options.settle_s:.0f}s)")
    spark, cut, global_data = asyncio.run(prepare(options, declared, say, spark))
    options.out.mkdir(parents=True, exist_ok=True)
    idle = ", no worker in the group" if cut.group_members == 0 else ""
    say(f"cut taken ({'settled' if cut.settled else f'NOT settled, lag {cut.group_lag}{idle}'})")
    sources, _ = topics_of(declared)
    partitions = partitions_of(cut, sources, options.partitions)
    declared = declare(options.spec(partitions, cut.taken_at_ms))
    try:
        report = reconcile(spark, options, cut, declared, global_data, say)
    finally:
        if own_session:
            spark.stop()
    report["seconds"] = round(say.elapsed, 3)
    path = kio.write_report(options.out, report)
    print(summary(report), flush=True)
    say(f"report written to {path}")
    return EXIT_DIFFERS if any(compare.differs(e) for e in report["tables"].values()) else EXIT_SAME


def check(options: Options) -> int:
    """``--preflight-only``: start the session and run the preflight on its executors,
    reading no topic; 0 when they have what the job needs (else PreflightError)."""
    say = Progress()
    checked_session(options, say, always=True).stop()
    say("preflight passed: the executors have what the job needs")
    return EXIT_SAME


def _conf_pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"not KEY=VALUE: {text!r}")
    return key.strip(), value


def parse_args(argv: list[str] | None = None, settings: Settings | None = None) -> Options:
    """The options of a run: the command line, and the settings the workers share
    (pipeline modules, window retention, event size limit, partitions)."""
    settings = settings or Settings()
    parser = argparse.ArgumentParser(
        prog="python -m jobs.recompute", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--bootstrap", default="127.0.0.1:9092", help="Kafka bootstrap servers")
    parser.add_argument("--out", type=Path, help="report.json and Parquet views (required)")
    parser.add_argument("--repair", action="store_true", help="publish corrections for differences")
    parser.add_argument("--master", default=None, help="Spark master (default local[*])")
    parser.add_argument("--app-id", default="streamstate", help="the workers' app id and group")
    parser.add_argument(
        "--settle-timeout",
        type=float,
        default=60.0,
        help="seconds to wait for the workers to catch up",
    )
    parser.add_argument("--examples", type=int, default=10, help="examples per table in the report")
    parser.add_argument("--shuffle-partitions", type=int, default=None)
    parser.add_argument(
        "--local-rows",
        type=int,
        default=LOCAL_ROWS,
        help="up to how many rows of the first stage (and of the live tables) the driver "
        "runs the later stages, the compare and the views itself (0: never)",
    )
    parser.add_argument(
        "--python-env",
        default=None,
        metavar="PYTHON",
        help="an interpreter every executor has, with the pipelines' dependencies "
        "(default on a cluster: the job packs the driver's and ships it)",
    )
    parser.add_argument(
        "--views",
        default=None,
        metavar="URI",
        help="where the Parquet views go (default: --out); on a cluster a place the "
        "executors and the driver share (hdfs://, s3a://, a shared mount)",
    )
    parser.add_argument(
        "--conf",
        action="append",
        default=[],
        type=_conf_pair,
        metavar="KEY=VALUE",
        help="a Spark setting, as spark-submit's --conf (repeatable)",
    )
    parser.add_argument(
        "--preflight-only",
        action="store_true",
        help="check the executors (their Python and the pipeline modules) and exit: 0 ready, 2 not",
    )
    args = parser.parse_args(argv)
    if args.out is None and not args.preflight_only:
        parser.error("the following arguments are required: --out")
    # spark-submit (PYSPARK_GATEWAY_PORT set) chooses the master itself.
    master = args.master or (None if "PYSPARK_GATEWAY_PORT" in os.environ else "local[*]")
    return Options(
        bootstrap=args.bootstrap,
        out=args.out or Path("."),  # a preflight writes nothing
        repair=args.repair,
        master=master,
        app_id=args.app_id,
        settle_s=args.settle_timeout,
        examples=args.examples,
        max_event_bytes=settings.max_event_bytes,
        window_retention_ms=int(settings.window_retention_days * DAY_MS),
        shuffle_partitions=args.shuffle_partitions,
        local_rows=args.local_rows,
        python_env=args.python_env,
        preflight_only=args.preflight_only,
        spark_conf=tuple(args.conf),
        views=args.views,
        modules=tuple(settings.pipeline_modules),
        partitions=settings.topic_partitions,
        gc_thresholds=settings.gc_thresholds,
    )


def main(argv: list[str] | None = None) -> int:
    try:
        options = parse_args(argv)
    except ValueError as error:  # the settings (a pydantic ValidationError)
        print(f"recompute: invalid settings: {error}", file=sys.stderr)
        return EXIT_ERROR
    try:
        return check(options) if options.preflight_only else run(options)
    except preflight.PreflightError as error:  # one line: what is missing, and the fix
        print(f"recompute: preflight failed: {error}", file=sys.stderr)
        return EXIT_PREFLIGHT
    except Exception as error:  # the exit status must tell an error from a difference
        print(f"recompute: failed: {type(error).__name__}: {error}", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
