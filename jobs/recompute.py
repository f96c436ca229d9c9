"""The nightly recompute: rebuild the tables from the retained source topics, reconcile them
with the live tables and optionally repair the live ones.

    python -m jobs.recompute --bootstrap 127.0.0.1:9092 --out DIR [--repair] [--master local[*]]
                             [--python-env PYTHON] [--conf KEY=VALUE ...] [--views URI]
    python -m jobs.recompute --preflight-only [--master URL] [--python-env PYTHON]

Exit status: 0 when nothing differs, 3 when something differs, 2 when the executors lack
what the job needs (the preflight), other non-zero on error.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO, TypeVar

if __package__ in (None, ""):  # run as a file, e.g. by spark-submit
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pyspark.sql import functions as sf

from jobs import compare, preflight, transforms
from jobs import io as kio
from jobs.cut import Cut, take_cut
from jobs.session import build_session, udf_jar_in_use

SOURCES = ("text-lines", "item-events", "products")
EXIT_SAME, EXIT_DIFFERS, EXIT_ERROR, EXIT_PREFLIGHT = 0, 3, 1, 2
DAY_MS = 86_400_000
T = TypeVar("T")
#: The scheduler pools of the views phase (those of the comparisons are the table names);
#: jobs/fairscheduler.xml declares them all.
STORES_POOL, WORDS_POOL, LIVE_POOL = "stores", "words", "live"


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

    @property
    def views_at(self) -> Path | str:
        """The views' location: ``--views``, else ``out`` (the report stays in ``out``)."""
        return self.views or self.out


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


async def _take_cut(options: Options) -> Cut:
    changelogs = [spec.changelog for spec in compare.specs(options.app_id).values()]
    return await asyncio.wait_for(
        take_cut(
            options.bootstrap,
            list(SOURCES),
            changelogs,
            [kio.CORRECTIONS_TOPIC],
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
        )
    try:
        if always or not str(spark.sparkContext.master).startswith("local"):
            preflight.run(spark, udf_jar_in_use(spark), say)
    except BaseException:
        if own:
            spark.stop()
        raise
    return spark


async def prepare(options: Options, say: Progress, spark: Any = None) -> tuple[Any, Cut]:
    """The checked session and the offset cut, at once: the JVM starts and the executors
    are checked while the cut waits for the workers to settle. A failed preflight ends
    the wait."""
    cutting = asyncio.ensure_future(_take_cut(options))
    try:
        ready = await asyncio.to_thread(checked_session, options, say, spark)
    except BaseException:
        cutting.cancel()
        with contextlib.suppress(BaseException):
            await cutting
        raise
    try:
        return ready, await cutting
    except BaseException:
        if spark is None:
            ready.stop()
        raise


def _word_count_view(options: Options, lines: Any, say: Progress) -> Any:
    counts = transforms.word_counts(lines, options.max_event_bytes)
    view = kio.write_view(counts, options.views_at, "word_counts")
    say(f"word_counts: {view.count()} words recomputed")
    return view


def _store_views(options: Options, events: Any, products: Any, say: Progress) -> dict[str, Any]:
    """inventory and sales_by_category from one aggregation, kept while both are written.

    The first pass parses the item events in the plain JSON form and sums them in the JVM;
    a second pass, only when the first left any, parses the others in Python.
    """
    limit = options.max_event_bytes
    versions = _catalogue(products, limit, say)
    first = transforms.plain_store_totals(events, versions, limit)
    if first is None:
        say("item-events: no Java UDF, every record is parsed in Python")
        first = transforms.store_totals(transforms.other_events(events, limit), versions)
    totals = first.persist()
    pending = transforms.pending_records(totals)
    if pending:
        say(f"item-events: {pending} records outside the plain JSON form, parsed in Python")
        other = transforms.store_totals(transforms.other_events(events, limit), versions)
        merged = transforms.merge_totals(totals, other).persist()
        totals.unpersist()
        totals = merged
    inventory = kio.write_view(transforms.inventory(totals), options.views_at, "inventory")
    views = {"inventory": inventory}
    say(f"inventory: {views['inventory'].count()} stores recomputed")
    sales = transforms.sales_by_category(totals)
    views["sales_by_category"] = kio.write_view(sales, options.views_at, "sales_by_category")
    say(f"sales_by_category: {views['sales_by_category'].count()} windows recomputed")
    totals.unpersist()
    versions.unpersist()
    return views


def _catalogue(products: Any, limit: int, say: Progress) -> Any:
    """The catalogue's versions, cached and counted before the events are read (the JVM's
    store totals broadcast them; so does the join of the Spark SQL path, once it knows
    their size). Records outside the plain form are parsed in Python, in a second pass
    that runs only when there are any: without one, no Python worker starts."""
    first = transforms.plain_product_versions(products, limit)
    if first is None:
        versions = transforms.product_versions(products, limit).persist()
    else:
        first = first.persist()
        pending = first.where(~sf.col("plain")).count()
        versions = first.where(sf.col("plain")).drop("plain")
        if pending:
            say(f"products: {pending} records outside the plain JSON form, parsed in Python")
            versions = versions.unionByName(transforms.other_product_versions(products, limit))
        versions = versions.persist()
    say(f"products: {versions.count()} catalogue versions")
    if first is not None:
        first.unpersist()  # versions is materialized
    return versions


def _live_tables(
    spark: Any, options: Options, cut: Cut, say: Progress
) -> tuple[dict[str, Any], Any]:
    """The live tables from their changelogs up to the cut, and the cached frame they
    are read from (the caller unpersists it once the tables are compared).

    The changelogs are read together and their latest values found in one aggregation,
    counted per changelog in the same Spark job. Each read or job of its own has a fixed
    cost: about 1.2 s to read a changelog of a few thousand records (measured, warm
    JVM), and a small job waits for a core behind the long tasks of the other pools.
    """
    specs = compare.specs(options.app_id)
    decoders = {
        "word_counts": transforms.live_word_counts,
        "inventory": transforms.live_inventory,
        "sales_by_category": transforms.live_sales_by_category,
    }
    ends = {spec.changelog: cut.changelogs.get(spec.changelog, {}) for spec in specs.values()}
    newest = transforms.latest_by_topic(kio.read_ranges(spark, options.bootstrap, ends)).persist()
    counts = {row["topic"]: row["count"] for row in newest.groupBy("topic").count().collect()}
    tables = {}
    for name, spec in specs.items():
        rows = newest.where(sf.col("topic") == spec.changelog).drop("topic")
        tables[name] = decoders[name](rows)
        say(f"{name}: {counts.get(spec.changelog, 0)} live keys read from {spec.changelog}")
    return tables, newest


def in_pool(spark: Any, name: str, work: Callable[..., T], *args: Any) -> T:
    """``work(*args)`` with the Spark jobs it submits in the scheduler pool ``name``.

    The session schedules pools fairly (``jobs/session.py``): the jobs of concurrent
    threads share the cores, so a small job (the catalogue) does not wait behind a large
    one's tasks, and the largest (the item events) starts at once. Measured on the
    bench's 10,000,000 records: 46.6 and 46.9 s, against 49.3 and 53.6 s first come, first
    served.
    """
    spark.sparkContext.setLocalProperty("spark.scheduler.pool", name)
    try:
        return work(*args)
    finally:
        spark.sparkContext.setLocalProperty("spark.scheduler.pool", None)


def views(
    spark: Any, options: Options, cut: Cut, say: Progress
) -> tuple[dict[str, Any], dict[str, Any], Any]:
    """The three tables recomputed from the sources up to the cut (written as Parquet),
    the live tables read from their changelogs, and the cached frame these come from.

    The word count, the store views and the changelog reads are Spark jobs submitted at
    once, so that one's tasks fill the cores another leaves idle (its last tasks, its
    writes, the driver's work between stages). Measured: the catalogue read alone first
    (the store views need it) made the whole job slower, 36.7 and 38.0 s against 34.2 and
    36.6 s.
    """
    read = {t: kio.read_range(spark, options.bootstrap, t, cut.sources.get(t, {})) for t in SOURCES}
    with ThreadPoolExecutor(max_workers=3, thread_name_prefix="recompute") as pool:
        stores = pool.submit(
            in_pool,
            spark,
            STORES_POOL,
            _store_views,
            options,
            read["item-events"],
            read["products"],
            say,
        )
        words = pool.submit(
            in_pool, spark, WORDS_POOL, _word_count_view, options, read["text-lines"], say
        )
        live = pool.submit(in_pool, spark, LIVE_POOL, _live_tables, spark, options, cut, say)
        stream, cached = live.result()
        return {"word_counts": words.result(), **stores.result()}, stream, cached


def reconcile(spark: Any, options: Options, cut: Cut, say: Progress) -> dict[str, Any]:
    """Build the report; publish corrections with ``--repair``."""
    batch, stream, cached = views(spark, options, cut, say)
    try:
        return _compare(spark, options, cut, batch, stream, say)
    finally:
        cached.unpersist()


def _compare(
    spark: Any,
    options: Options,
    cut: Cut,
    batch: dict[str, Any],
    stream: dict[str, Any],
    say: Progress,
) -> dict[str, Any]:
    horizon = transforms.expired_horizon(cut.taken_at_ms, options.window_retention_ms)
    batch["sales_by_category"] = transforms.live_windows(batch["sales_by_category"], horizon)
    stream["sales_by_category"] = transforms.live_windows(stream["sales_by_category"], horizon)
    specs = compare.specs(options.app_id)

    def reconcile_table(name: str) -> dict[str, Any]:
        spec = specs[name]
        differences = compare.diff(spec, batch[name], stream[name]).persist()
        entry = compare.summarize(differences, options.examples)
        say(f"{name}: compared {entry['keys_compared']} keys")
        if options.repair and _differs(entry):
            sent = kio.publish_corrections(
                options.bootstrap, compare.corrections(spec, differences)
            )
            entry["corrections_published"] = sent
            say(f"{name}: published {sent} corrections")
        differences.unpersist()
        return entry

    # The tables are compared at once: small Spark jobs, mostly waiting on each other.
    with ThreadPoolExecutor(max_workers=len(specs), thread_name_prefix="compare") as pool:
        work = [pool.submit(in_pool, spark, name, reconcile_table, name) for name in specs]
        tables = {name: done.result() for name, done in zip(specs, work, strict=True)}
    published = sum(entry.get("corrections_published", 0) for entry in tables.values())
    return {
        "cut": cut.as_json(),
        "tables": tables,
        "cut_taken_at_ms": cut.taken_at_ms,
        "cut_settled": cut.settled,
        "group_lag": cut.group_lag,
        "group_members": cut.group_members,
        "log_start": {t: {str(p): o for p, o in v.items()} for t, v in cut.log_start.items()},
        "sales_window_horizon_ms": horizon,
        "corrections_published": published,
    }


def _differs(entry: dict[str, Any]) -> bool:
    return any(entry[k] for k in compare.DIFFERENCES)


def _short(value: Any, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def summary(report: dict[str, Any]) -> str:
    """The human summary printed on stdout."""
    cut = report["cut"]
    lines = ["streamstate recompute: batch vs live tables at the offset cut"]
    for topic in SOURCES:
        offsets = cut.get(topic, {})
        lines.append(f"  cut {topic}: {sum(offsets.values())} offsets in {len(offsets)} partitions")
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
            lines.append(
                f"      {example['status']}: {example['key']!r}"
                f" batch={_short(example['batch'])} stream={_short(example['stream'])}"
            )
    differs = any(_differs(e) for e in report["tables"].values())
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
    say(f"taking the offset cut on {options.bootstrap} (settle up to {options.settle_s:.0f}s)")
    spark, cut = asyncio.run(prepare(options, say, spark))
    options.out.mkdir(parents=True, exist_ok=True)
    idle = ", no worker in the group" if cut.group_members == 0 else ""
    say(f"cut taken ({'settled' if cut.settled else f'NOT settled, lag {cut.group_lag}{idle}'})")
    try:
        report = reconcile(spark, options, cut, say)
    finally:
        if own_session:
            spark.stop()
    report["seconds"] = round(say.elapsed, 3)
    path = kio.write_report(options.out, report)
    print(summary(report), flush=True)
    say(f"report written to {path}")
    return EXIT_DIFFERS if any(_differs(e) for e in report["tables"].values()) else EXIT_SAME


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


def parse_args(argv: list[str] | None = None) -> Options:
    env = os.environ
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
        "--python-env",
        default=None,
        metavar="PYTHON",
        help="an interpreter every executor has, with pyarrow and pydantic "
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
        help="check the executors (their Python and the UDF jar) and exit: 0 ready, 2 not",
    )
    args = parser.parse_args(argv)
    if args.out is None and not args.preflight_only:
        parser.error("the following arguments are required: --out")
    # spark-submit (PYSPARK_GATEWAY_PORT set) chooses the master itself.
    master = args.master or (None if "PYSPARK_GATEWAY_PORT" in env else "local[*]")
    days = float(env.get("STREAMSTATE_WINDOW_RETENTION_DAYS", "7"))
    return Options(
        bootstrap=args.bootstrap,
        out=args.out or Path("."),  # a preflight writes nothing
        repair=args.repair,
        master=master,
        app_id=args.app_id,
        settle_s=args.settle_timeout,
        examples=args.examples,
        max_event_bytes=int(env.get("STREAMSTATE_MAX_EVENT_BYTES", str(64 * 1024))),
        window_retention_ms=int(days * DAY_MS),
        shuffle_partitions=args.shuffle_partitions,
        python_env=args.python_env,
        preflight_only=args.preflight_only,
        spark_conf=tuple(args.conf),
        views=args.views,
    )


def main(argv: list[str] | None = None) -> int:
    options = parse_args(argv)
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
