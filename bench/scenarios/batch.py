"""Batch: the nightly recompute over the retained source topics against a bare Spark
count of the same topics (the same session and connector jars), on ``local[*]`` and on a
Spark standalone cluster of two one-core workers started on this machine."""

from __future__ import annotations

import asyncio
import importlib.util
import shutil
import time
from pathlib import Path
from typing import Any

import orjson

from bench import data
from bench.config import Sizes
from bench.kafka import BenchKafka, create_project_topics, produce, records_in
from bench.procs import run_module
from bench.scenarios import Outcome

SOURCES = ["text-lines", "item-events", "products", "payments"]


def recompute_available() -> bool:
    return importlib.util.find_spec("jobs.recompute") is not None


def preload(kafka: BenchKafka, events: int) -> float:
    """Top the source topics up to ``events`` records: four fifths store events."""
    started = time.monotonic()
    asyncio.run(create_project_topics(kafka.bootstrap))
    missing = events - records_in(kafka.bootstrap, SOURCES)
    if missing > 0:
        items = missing * 4 // 5
        asyncio.run(produce(kafka.bootstrap, "item-events", data.item_events(items, start=10**9)))
        asyncio.run(produce(kafka.bootstrap, "text-lines", data.text_lines(missing - items)))
    return time.monotonic() - started


def run(kafka: BenchKafka, sizes: Sizes, work: Path) -> Outcome:
    if not recompute_available():
        return Outcome(
            {"recompute_s": None, "cluster_recompute_s": None, "scan_s": None, "events": None},
            ["`python -m jobs.recompute` does not exist yet (the batch issue): not measured."],
        )
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    preload_s = preload(kafka, sizes.batch_events)
    events = records_in(kafka.bootstrap, SOURCES)
    notes = [
        f"{events:,} records in the source topics (topped up in {preload_s:.0f} s). "
        "Both figures are the wall time of a fresh process (JVM and Spark start included), "
        "`--master local[*]` on this machine."
    ]
    # The bare count and the recompute alternate, the count first, so that neither has
    # the slot after the preload or the machine's slower minutes to itself; the fastest
    # run of each is compared (a run is only ever slowed by what else the machine does).
    scans: list[float] = []
    recomputes: list[float] = []
    statuses: list[int] = []
    scan: dict[str, Any] = {}
    for round_ in range(1, sizes.batch_rounds + 1):
        scan_s, found = _scan(kafka, sizes, work, f"scan-{round_}", [], notes)
        if scan_s is not None:
            scans.append(scan_s)
            scan = found
        status, _, recompute_s = run_module(
            "jobs.recompute",
            ["--bootstrap", kafka.bootstrap, "--out", str(work / "out"), "--master", "local[*]"],
            timeout=sizes.batch_timeout_s,
            log=work / f"recompute-{round_}.log",
        )
        statuses.append(status)
        if status in (0, 3):
            recomputes.append(recompute_s)
        else:
            reason = f"timed out after {sizes.batch_timeout_s:.0f} s" if status == -9 else status
            notes.append(
                f"`jobs.recompute` round {round_} failed ({reason}; see "
                f"{work / f'recompute-{round_}.log'})."
            )
    recompute = min(recomputes) if len(recomputes) == len(statuses) else None
    scan_s = min(scans) if len(scans) == sizes.batch_rounds else None
    notes.append(
        f"{sizes.batch_rounds} round{'s' if sizes.batch_rounds != 1 else ''} of a bare count "
        f"then the recompute: counts "
        f"{_seconds(scans)}, recomputes {_seconds(recomputes)}; the fastest of each is "
        f"compared. `jobs.recompute` exited {_listed(statuses)} (3: live tables differ "
        "from the batch)."
    )
    cluster_s = _on_cluster(kafka, sizes, work, notes)
    from jobs.io import FETCH_MAX_WAIT_MS  # pyspark: the batch extra

    # The same count with the job's own reader settings, so that the ratio can be read
    # both ways: against a bare count, and against a count that waits as little as the job.
    wait = ["--fetch-max-wait-ms", str(FETCH_MAX_WAIT_MS)]
    tuned_s, tuned = _scan(kafka, sizes, work, "scan-job-reader", wait, notes)
    if recompute and scan_s and tuned_s:
        notes.append(
            f"A count with the job's reader settings (`kafka.fetch.max.wait.ms` "
            f"{FETCH_MAX_WAIT_MS}, `jobs/io.py`) took {tuned_s:.1f} s, against {scan_s:.1f} s"
            f" bare: the recompute is {recompute / tuned_s:.2f}x that count."
        )
    return Outcome(
        {
            "recompute_s": recompute,
            "cluster_recompute_s": cluster_s,
            "scan_s": scan_s,
            "events": events,
        },
        notes,
        {
            "scan": scan,
            "scan_job_reader": tuned,
            "scan_job_reader_s": tuned_s,
            "recompute_status": statuses[-1] if statuses else None,
            "recompute_runs_s": recomputes,
            "scan_runs_s": scans,
        },
    )


def _seconds(runs: list[float]) -> str:
    return ", ".join(f"{seconds:.1f} s" for seconds in runs) or "none"


def _listed(values: list[int]) -> str:
    return ", ".join(str(value) for value in values) or "nothing"


def _scan(
    kafka: BenchKafka, sizes: Sizes, work: Path, name: str, extra: list[str], notes: list[str]
) -> tuple[float | None, dict[str, Any]]:
    """One bare Spark count of the sources in a fresh process: its wall time and output."""
    status, out, seconds = run_module(
        "bench.baselines.spark_scan",
        ["--bootstrap", kafka.bootstrap, "--topics", ",".join(SOURCES), *extra],
        timeout=sizes.batch_timeout_s,
        log=work / f"{name}.log",
    )
    if status != 0:
        notes.append(f"The Spark count `{name}` exited {status} (see {work / name}.log).")
        return None, {}
    return seconds, orjson.loads(out.strip().splitlines()[-1])


def _on_cluster(kafka: BenchKafka, sizes: Sizes, work: Path, notes: list[str]) -> float | None:
    """The recompute's wall time on a standalone master with two one-core workers (the
    job's packed Python environment shipped to them), or None when it failed."""
    from core.settings import Settings
    from jobs.pyenv import executor_archive
    from jobs.standalone import StandaloneCluster

    started = time.monotonic()
    # packed once for the pipeline modules; a cached one is reused
    archive = executor_archive(modules=Settings().pipeline_modules)
    packed_s = time.monotonic() - started
    cluster = StandaloneCluster(work / "spark-standalone", workers=2)
    cluster.start()
    try:
        # The driver listens on loopback, where the workers reach it.
        loopback = [f"spark.driver.{k}=127.0.0.1" for k in ("host", "bindAddress")]
        args = ["--bootstrap", kafka.bootstrap, "--out", str(work / "out-cluster")]
        args += ["--master", cluster.master_url, *[f"--conf={c}" for c in loopback]]
        status, _, seconds = run_module(
            "jobs.recompute", args, timeout=sizes.batch_timeout_s, log=work / "cluster.log"
        )
    finally:
        cluster.stop()
    size_mb = archive.stat().st_size / 1e6
    packing = f"packed now in {packed_s:.0f} s" if packed_s >= 1 else "packed by an earlier run"
    notes.append(
        f"`cluster_recompute_s`: the same job with `--master spark://...` on a standalone "
        f"master and two one-core workers on this machine (the driver, the master and both "
        f"executors share its cores); each executor unpacks the job's Python environment "
        f"({size_mb:.0f} MB archive, {packing} and cached) and runs "
        "the preflight before the Kafka reads."
    )
    if status not in (0, 3):
        notes.append(f"The cluster run exited {status} (see {work / 'cluster.log'}).")
        return None
    notes.append(_agreement(work / "out" / "report.json", work / "out-cluster" / "report.json"))
    return seconds


def _agreement(local: Path, cluster: Path) -> str:
    """Whether the two runs' reports count the same keys and differences per table."""
    counted = ("keys_compared", "mismatched", "missing_in_stream", "missing_in_batch")
    if not local.exists():
        return "The local run wrote no report to compare the cluster's with."
    tables = [orjson.loads(path.read_bytes())["tables"] for path in (local, cluster)]
    differing = [
        name
        for name, entry in tables[0].items()
        if any(entry[k] != tables[1].get(name, {}).get(k) for k in counted)
    ]
    if differing:
        return f"The cluster's report counts otherwise than the local one in: {differing}."
    return "The cluster's report counts the same keys and differences as the local one."
