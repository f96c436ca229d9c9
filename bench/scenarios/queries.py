"""Interactive queries and failover on two workers.

Queries: a separate load-generator process reads keys from one worker, first keys that
worker owns (local), then keys the other worker owns (routed by forwarding). Failover:
the owner of the routed keys is killed with SIGKILL and its keys are read through the
survivor until every one is answered by an active replica again.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import orjson

from bench import data, wrk
from bench.config import Sizes
from bench.procs import Worker, run_module
from bench.scenarios import Outcome

TABLE = "word_counts"


def classify(worker: Worker, keys: list[str]) -> dict[str, list[str]]:
    """Keys by the URL of their active owner, from the worker's key metadata."""
    owners: dict[str, list[str]] = {}
    for key in keys:
        status, body = worker.get(f"/metadata/tables/{TABLE}/keys/{quote(key)}")
        if status == 200 and isinstance(body, dict) and body.get("active"):
            owners.setdefault(str(body["active"]).rstrip("/"), []).append(key)
    return owners


def wait_two_owners(a: Worker, b: Worker, keys: list[str], timeout: float) -> dict[str, list[str]]:
    """Wait until both workers own some of ``keys``; return the classification."""
    deadline = time.monotonic() + timeout
    owners: dict[str, list[str]] = {}
    while time.monotonic() < deadline:
        owners = classify(a, keys)
        if owners.get(a.url) and owners.get(b.url):
            return owners
        time.sleep(1.0)
    counts = {url: len(found) for url, found in owners.items()}
    raise TimeoutError(f"keys never spread over both workers: {counts}")


#: The Python load generator, named in the report when it measured.
PYTHON_TOOL = "python -m bench.loadgen"


def load_tool() -> str:
    """wrk when it is installed, unless ``BENCH_IQ_TOOL=python`` asks for the fallback."""
    wanted = os.environ.get("BENCH_IQ_TOOL", "wrk")
    if wanted not in ("wrk", "python"):
        raise ValueError(f"BENCH_IQ_TOOL must be 'wrk' or 'python', not {wanted!r}")
    return wrk.WRK if wanted == "wrk" and wrk.available() else PYTHON_TOOL


def load(
    worker: Worker, keys: list[str], sizes: Sizes, work: Path, name: str, query: str = ""
) -> dict[str, Any]:
    """Closed-loop reads of ``keys`` from ``worker``, by wrk or else the Python generator."""
    if load_tool() == wrk.WRK:
        return wrk.run(
            worker.url,
            TABLE,
            keys,
            duration_s=sizes.iq_duration_s,
            connections=sizes.iq_connections,
            work=work,
            name=name,
            query=query,
        )
    keys_file = work / f"{name}-keys.txt"
    keys_file.write_text("\n".join(keys))
    args = ["--base", worker.url, "--table", TABLE, "--keys-file", str(keys_file)]
    args += ["--duration", str(sizes.iq_duration_s), "--connections", str(sizes.iq_connections)]
    if query:
        args += ["--query", query]
    status, out, _ = run_module(
        "bench.loadgen", args, timeout=sizes.iq_duration_s + 120, log=work / "loadgen.log"
    )
    if status != 0:
        raise RuntimeError(f"load generator exited {status}; see {work / 'loadgen.log'}")
    result: dict[str, Any] = orjson.loads(out.strip().splitlines()[-1])
    result["tool"] = PYTHON_TOOL
    return result


def standby_catch_up(worker: Worker, timeout: float) -> dict[str, Any]:
    """Until every standby copy ``worker`` holds has applied its changelog's end (its own
    report at ``/internal/console/worker``): seconds since the worker's start, and the
    changelog records its standbys applied."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status, report = worker.get("/internal/console/worker")
        if status == 200 and isinstance(report, dict):
            lags = [c["changelog_lag"] for c in report["copies"] if c["replica"] == "standby"]
            if lags and all(lag == 0 for lag in lags):
                stats = report["restore"]["stats"] or {}
                return {
                    "seconds": time.monotonic() - worker.started_at,
                    "records": int(stats.get("standby_records") or 0),
                    "copies": len(lags),
                }
        time.sleep(0.2)
    return {"seconds": None, "records": None, "copies": None}


def machine_steadiness(duration_s: float, work: Path) -> dict[str, Any] | None:
    """:mod:`bench.hiccups` in its own process: how steadily one core of this machine
    runs a bare compute loop, with the workers idle; None when it failed (the reads are
    measured all the same)."""
    log = work / "hiccups.log"
    status, out, _ = run_module(
        "bench.hiccups", [str(duration_s)], timeout=duration_s + 60, log=log
    )
    if status != 0:
        return None
    found: dict[str, Any] = orjson.loads(out.strip().splitlines()[-1])
    return found


def steadiness_note(steadiness: dict[str, Any] | None, work: Path) -> str:
    if steadiness is None:
        return (
            f"The machine's steadiness was not measured: bench.hiccups failed ({work}/hiccups.log)."
        )
    return (
        f"The machine's own steadiness, just before the reads, with both workers idle "
        f"(`python -m bench.hiccups`, a bare compute loop pinned to core "
        f"{steadiness['core']}, counted in {steadiness['windows']} windows of "
        f"{steadiness['window_ms']:.0f} ms): {steadiness['slow_share']:.1%} of the windows "
        f"ran at under half the median speed, in {steadiness['slow_runs_per_s']:.1f} runs "
        f"a second, the longest {steadiness['longest_slow_ms']:.0f} ms. A read in flight "
        "during such a run waits for it whatever the server does: where the slow windows "
        "cover more than 1% of the time, they set a floor under the p99."
    )


def run_queries(a: Worker, b: Worker, sizes: Sizes, work: Path) -> tuple[Outcome, list[str]]:
    """Both workers ready; returns the outcome and the keys ``b`` owns."""
    caught_up = standby_catch_up(b, sizes.restore_timeout_s)
    step = max(1, sizes.restore_keys // sizes.iq_sample_keys)
    sample = [data.counter_key(n) for n in range(0, sizes.restore_keys, step)]
    owners = wait_two_owners(a, b, sample, timeout=120)
    local, routed = owners[a.url], owners[b.url]
    steadiness = machine_steadiness(min(10.0, sizes.iq_duration_s / 3), work)
    local_run = load(a, local, sizes, work, "local")
    routed_run = load(a, routed, sizes, work, "routed")
    figures = {
        "local_rps": local_run["rps"],
        "local_p99_ms": local_run["latency_ms"]["p99"],
        "routed_rps": routed_run["rps"],
        "routed_p99_ms": routed_run["latency_ms"]["p99"],
        "load_generator": local_run["tool"],
        "standby_catch_up_s": caught_up["seconds"],
        "standby_records": caught_up["records"],
        "machine_slow_pct": None
        if steadiness is None
        else round(100 * steadiness["slow_share"], 2),
        "machine_longest_slow_ms": None if steadiness is None else steadiness["longest_slow_ms"],
    }
    notes = [
        f"Two workers, {TABLE} with {sizes.restore_keys:,} keys; {len(local)} local and "
        f"{len(routed)} routed keys of a sample, classified by "
        f"`/metadata/tables/{TABLE}/keys/{{key}}`.",
        f"Measured by {tool_text(local_run)}, a separate process, {sizes.iq_connections} "
        f"keep-alive connections (closed loop), {sizes.iq_duration_s:.0f} s each, cycling "
        "through the fixed key set; rps counts 2xx answers only; the load generator shares "
        "the 2 cores with both workers.",
        f"Failed reads (non-2xx or no answer): local {local_run['failed']}, routed "
        f"{routed_run['failed']}"
        + (f"; replicas seen routed: {routed_run['replicas']}." if routed_run["replicas"] else "."),
    ]
    notes.append(steadiness_note(steadiness, work))
    if caught_up["seconds"] is None:
        notes.append("The second worker's standby copies did not catch up in time.")
    else:
        notes.append(
            f"The second worker's {caught_up['copies']} standby copies applied "
            f"{caught_up['records']:,} changelog records and reached the changelog's end "
            f"{caught_up['seconds']:.1f} s after its start (its own report)."
        )
    details = {
        "local": local_run,
        "routed": routed_run,
        "standby_catch_up": caught_up,
        "machine_steadiness": steadiness,
    }
    return Outcome(figures, notes, details), routed


def tool_text(run: dict[str, Any]) -> str:
    """How the report names the tool that measured ``run``."""
    if run["tool"] == wrk.WRK:
        return f"`{run['command']}` (Debian's wrk, Lua script over the keys)"
    return (
        f"`{PYTHON_TOOL}` (aiohttp; the fallback: wrk was not installed or "
        "BENCH_IQ_TOOL=python asked for it)"
    )


async def read_all(
    session: aiohttp.ClientSession, base: str, keys: list[str]
) -> tuple[int, int, list[int]]:
    """One pass over ``keys``: (answers from an active replica, failed reads, statuses)."""

    async def read(key: str) -> tuple[int, str]:
        try:
            async with session.get(f"{base}/tables/{TABLE}/keys/{quote(key)}") as answer:
                body = await answer.read()
                if answer.status != 200:
                    return answer.status, ""
                return 200, str(orjson.loads(body).get("replica"))
        except (TimeoutError, aiohttp.ClientError, ValueError):
            return 0, ""

    answers = await asyncio.gather(*(read(k) for k in keys))
    active = sum(1 for status, replica in answers if status == 200 and replica == "active")
    failed = sum(1 for status, _ in answers if status != 200)
    return active, failed, [status for status, _ in answers]


async def watch_failover(
    base: str, keys: list[str], killed_at: float, give_up_s: float
) -> dict[str, Any]:
    series: list[tuple[float, int, int]] = []
    failed_reads = 0
    connector = aiohttp.TCPConnector(limit=8)
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=5)
    ) as session:
        while time.monotonic() - killed_at < give_up_s:
            active, failed, _ = await read_all(session, base, keys)
            now = time.monotonic() - killed_at
            failed_reads += failed
            series.append((now, active, failed))
            if active == len(keys):
                return {"seconds_to_active": now, "failed_reads": failed_reads, "series": series}
            await asyncio.sleep(0.2)
    return {"seconds_to_active": None, "failed_reads": failed_reads, "series": series}


def run_failover(a: Worker, b: Worker, keys: list[str], sizes: Sizes) -> Outcome:
    """Kill ``b`` and read its keys through ``a`` until all come from an active replica."""
    keys = keys[: sizes.failover_keys]
    b.kill9()
    killed_at = time.monotonic()
    result = asyncio.run(watch_failover(a.url, keys, killed_at, give_up_s=180))
    figures = {
        "seconds_to_active": result["seconds_to_active"],
        "failed_reads": result["failed_reads"],
    }
    notes = [
        f"kill -9 of the owner of {len(keys)} keys; the survivor was asked for all of them in "
        "passes (8 concurrent reads) until every answer was 200 with `replica: active`; "
        "failed_reads counts non-200 answers meanwhile. Session timeout: the worker "
        "default (BROKER_SESSION_TIMEOUT)."
    ]
    return Outcome(figures, notes, {"series": result["series"]})
