"""A worker's disk filling up under sustained load: its stores cannot write any more.

One of two workers keeps its data dir on a small tmpfs of its own. Under load, a filler
file takes the rest of that filesystem, so the next RocksDB write fails (ENOSPC). Pass:
the worker says so (``/ready`` 503 ``failed``, ``streamstate_engine_failed 1``) and
stays up; the offsets the group committed for its partitions do not go past what it
holds: under at_least_once past what its stores hold (offsets are committed after the
store write), under exactly_once past what the changelogs hold (they are committed with
the offsets in one transaction: the changelog holds what the store lacks). Once the
filler is gone and the worker restarted, the tables equal the ground truth
(exactly_once) or are not under-counted (at_least_once).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
from aiokafka.admin import AIOKafkaAdminClient
from rocksdict import AccessType, Options, Rdict

from chaos.env import crashes, group, metric, reset, wait_ready, workdir
from chaos.lag import GROUP
from chaos.load import LoadLevel
from chaos.reader import TopicReader, committed_offsets
from chaos.session import Session
from core.topics import POSITION_KEY
from tests.support.kafka import LocalKafka
from tests.support.workers import Worker

#: The tables whose positions name the offsets a task applied, and the topics their
#: task reads directly (a position also names sources upstream of a repartition topic:
#: those are other tasks' offsets).
DIRECT = {
    "inventory": ("item-events",),
    "unsettled_sales": ("item-events", "payments"),
    "word_counts": ("streamstate-word_counts-repartition",),
    "sales_by_category": ("streamstate-sales_by_category-repartition",),
}
TMPFS_MB = 512


class Skipped(Exception):
    """The scenario cannot run here (no permission to mount)."""


def run(
    kafka: LocalKafka, level: LoadLevel, guarantee: str, load_s: float = 15.0
) -> dict[str, Any]:
    reset(kafka)
    work = workdir(f"disk-{guarantee}")
    mount = work / "w0"
    try:
        with tmpfs(mount, TMPFS_MB):
            return _run(kafka, level, guarantee, work, load_s)
    except Skipped as why:
        return {"skipped": str(why), "guarantee": guarantee}


@contextlib.contextmanager
def tmpfs(path: Path, size_mb: int) -> Iterator[Path]:
    """A tmpfs of ``size_mb`` at ``path``, unmounted afterwards whatever happens."""
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise Skipped(f"mount -t tmpfs failed: {(done.stderr or done.stdout).strip()[:200]}")
    try:
        yield path
    finally:
        if subprocess.run(["umount", str(path)], capture_output=True, check=False).returncode:
            subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)


def _run(
    kafka: LocalKafka, level: LoadLevel, guarantee: str, work: Path, load_s: float
) -> dict[str, Any]:
    session = Session(kafka, level, work, active_s=load_s * 2 + 30.0, seed=11)
    try:
        with group(kafka, work, PROCESSING_GUARANTEE=guarantee) as members:
            full, other = members.add("w0"), members.add("w1")
            full.wait_ready(240)
            other.wait_ready(240)
            session.start_load()
            time.sleep(load_s)
            figures = _fault(kafka, session, full, guarantee)
            figures.update(_recover(session, full, load_s))
            figures["agent_crashes"] = crashes(full) + crashes(other)
    finally:
        load = session.close()
    return {"guarantee": guarantee, "tmpfs_mb": TMPFS_MB, **figures, "load": load}


def _fault(kafka: LocalKafka, session: Session, worker: Worker, guarantee: str) -> dict[str, Any]:
    """Fill the disk, watch the worker report it, then compare committed offsets with
    what its stores and the changelogs hold."""
    filled = time.monotonic()
    filler = fill(worker.datadir)
    reported = _wait_failed(worker, timeout=60.0)
    owned = _actives(worker)
    committed_at_report = group_committed(kafka.bootstrap)
    time.sleep(5.0)  # the load goes on: nothing more may be committed for its partitions
    session.pause()
    committed = group_committed(kafka.bootstrap)
    alive = worker.alive()
    worker.kill9()  # its stores are out of order: kill it as a crash would
    stored = stored_positions(worker.datadir, owned, worker.datadir.parent / "w0-copy")
    changelog = changelog_positions(kafka.bootstrap, owned)
    filler_mb = round(filler.stat().st_size / 2**20)
    filler.unlink()  # the fault clears
    moved = _moved(committed_at_report, committed, owned)
    return {
        "filler_mb": filler_mb,
        "worker_alive_after_fault": alive,
        "report": {**reported, "after_s": _since(filled, reported.get("at"))},
        "partitions_of_the_worker": sorted(owned),
        "committed_moved_after_report": moved,
        "offsets": _offsets(committed, stored, changelog),
    }


def fill(directory: Path) -> Path:
    """Write zeros to ``directory/filler`` until the filesystem is full."""
    usage = shutil.disk_usage(directory)
    if usage.free < (1 << 20):
        raise RuntimeError(
            f"{directory} is full before the fault ({usage.used >> 20} of "
            f"{usage.total >> 20} MiB used); the largest files: {largest(directory)}"
        )
    filler = directory / "filler"
    chunk = b"\0" * (1 << 20)
    with filler.open("wb") as out:
        try:
            while True:
                out.write(chunk)
                out.flush()
        except OSError as error:
            if error.errno != errno.ENOSPC:
                raise
    return filler


def largest(directory: Path, n: int = 5) -> list[tuple[str, int]]:
    """The ``n`` largest files under ``directory``: path and size in KiB."""
    sizes = [
        (str(p.relative_to(directory)), p.stat().st_blocks * 512 >> 10)
        for p in directory.rglob("*")
        if p.is_file()
    ]
    return sorted(sizes, key=lambda item: -item[1])[:n]


def _wait_failed(worker: Worker, timeout: float) -> dict[str, Any]:
    """Poll /ready and /metrics until both report the failure; what they said."""
    deadline = time.monotonic() + timeout
    last: dict[str, Any] = {}
    while time.monotonic() < deadline and worker.alive():
        try:
            status, body = worker.get("/ready", timeout=2.0)
            failed_metric = metric(worker, "streamstate_engine_failed")
        except (OSError, RuntimeError):
            time.sleep(0.05)
            continue
        state = body.get("status") if isinstance(body, dict) else None
        last = {"ready": status, "status": state, "metric": failed_metric, "body": body}
        if status == 503 and state == "failed" and failed_metric == 1:
            return {**last, "at": time.monotonic()}
        time.sleep(0.05)
    return {**last, "at": None, "alive": worker.alive()}


def _since(start: float, end: float | None) -> float | None:
    return None if end is None else round(end - start, 2)


def _actives(worker: Worker) -> set[int]:
    """The partitions the worker holds active (its own answer of /metadata)."""
    status, body = worker.get("/metadata", timeout=10.0)
    if status != 200:
        return set()
    for host in body["hosts"]:
        if host["url"].rstrip("/") == worker.url:
            return {p for parts in host["active"].values() for p in parts}
    return set()


def group_committed(bootstrap: str) -> dict[tuple[str, int], int]:
    async def read() -> dict[tuple[str, int], int]:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            return await committed_offsets(admin, GROUP)
        finally:
            await admin.close()

    return asyncio.run(read())


def _moved(
    before: dict[tuple[str, int], int], after: dict[tuple[str, int], int], owned: set[int]
) -> dict[str, int]:
    """Committed offsets of the worker's partitions that moved between two snapshots."""
    return {
        f"{topic}[{partition}]": after[(topic, partition)] - offset
        for (topic, partition), offset in sorted(before.items())
        if partition in owned and after.get((topic, partition), offset) != offset
    }


Positions = dict[tuple[str, int], dict[tuple[str, int], int]]


def stored_positions(datadir: Path, owned: set[int], copy: Path) -> Positions:
    """(table, partition) -> the source offsets its store says it applied, read from a
    copy of the data dir (the original's filesystem is full)."""
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(datadir, copy, ignore=shutil.ignore_patterns("filler"))
    found: Positions = {}
    for table in DIRECT:
        for partition in owned:
            for path in copy.rglob(f"{table}-{partition}.db"):
                raw = _read_key(path, POSITION_KEY)
                if raw is not None:
                    found[(table, partition)] = _applied(raw, table, partition)
    shutil.rmtree(copy, ignore_errors=True)
    return found


def _read_key(path: Path, key: bytes) -> bytes | None:
    db = Rdict(str(path), options=Options(raw_mode=True), access_type=AccessType.read_only())
    try:
        value = db.get(key)
    finally:
        db.close()
    return value if isinstance(value, bytes) else None


def _applied(raw: bytes, table: str, partition: int) -> dict[tuple[str, int], int]:
    """The offsets of the table partition's own inputs that a position names."""
    applied = orjson.loads(raw)["applied"]
    return {
        (topic, partition): int(parts[str(partition)])
        for topic, parts in applied.items()
        if topic in DIRECT[table] and str(partition) in parts
    }


def changelog_positions(bootstrap: str, owned: set[int]) -> Positions:
    """(table, partition) -> the source offsets of the last committed position record
    in the table's changelog."""
    found: Positions = {}
    for table in DIRECT:

        def keep(partition: int, records: Any, table: str = table) -> None:
            for record in records:
                if record.key == POSITION_KEY and partition in owned:
                    found[(table, partition)] = _applied(record.value, table, partition)

        TopicReader(bootstrap, f"streamstate-{table}-changelog").read_new(keep)
    return found


def _offsets(
    committed: dict[tuple[str, int], int], stored: Positions, changelog: Positions
) -> dict[str, Any]:
    """Per (table partition, input): committed, stored, in the changelog; and where the
    committed offset lies past them."""
    rows: list[dict[str, Any]] = []
    for (table, partition), applied in sorted(stored.items()):
        logged = changelog.get((table, partition), {})
        for tp, offset in sorted(applied.items()):
            rows.append(
                {
                    "table": f"{table}[{partition}]",
                    "input": f"{tp[0]}[{tp[1]}]",
                    "committed": committed.get(tp),
                    "stored": offset,
                    "changelog": logged.get(tp),
                }
            )

    def past(column: str) -> list[dict[str, Any]]:
        """The rows whose committed offset lies past ``column``'s."""
        return [
            r
            for r in rows
            if None not in (r["committed"], r[column]) and r["committed"] > r[column]
        ]

    return {
        "compared": len(rows),
        "committed_past_store": len(past("stored")),
        "committed_past_changelog": len(past("changelog")),
        "records_store_lacked": sum(r["committed"] - r["stored"] for r in past("stored")),
        "examples_past_store": past("stored")[:3],
        "rows": rows[:40],
    }


def _recover(session: Session, worker: Worker, load_s: float) -> dict[str, Any]:
    """Restart the worker on its data dir (the filler gone), load on, then compare."""
    restarted = time.monotonic()
    worker.start()
    ready, failure = wait_ready(worker, 240.0)
    session.resume()
    time.sleep(load_s / 2)
    session.pause()
    settled = session.settle()
    return {
        "restart_to_ready_s": None if ready is None else round(ready - restarted, 2),
        "restart_failed": failure,
        "drain_after_pause_s": settled.drain_s,
        "drift": settled.drift.as_dict(),
        **session.losses(),
    }
