"""The nightly scheduler: runs the batch recompute (``python -m jobs.recompute``) on a cron.

    python -m ops.nightly            # on STREAMSTATE_NIGHTLY_CRON (default "0 2 * * *", UTC)
    python -m ops.nightly --once     # one run now; exits with the job's status (0, 3, ...)

The job runs on STREAMSTATE_SPARK_MASTER (default ``local[*]``; ``--master`` overrides it).
On a cluster it ships its Python environment to the executors, or uses the interpreter
``PYSPARK_PYTHON`` names there, and ``--views-root`` places the Parquet views where the
executors write them (docs/operations.md).

Each run writes ``report.json`` and the Parquet views to ``<out-root>/<UTC time>/`` and
prints the job's progress and summary. Each run is its own process (its own Spark JVM),
so one failed run cannot break the next; SIGTERM stops a running job and the scheduler.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType

from croniter import croniter

from core.settings import Settings


def log(message: str) -> None:
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    print(f"nightly {stamp} {message}", flush=True)


def next_run(cron: str, after: datetime) -> datetime:
    """The first time after ``after`` that ``cron`` names (UTC)."""
    return croniter(cron, after).get_next(datetime)  # type: ignore[no-any-return]


def prune(root: Path, keep: int) -> None:
    """Delete all but the ``keep`` newest run directories."""
    runs = sorted(p for p in root.iterdir() if p.is_dir()) if root.exists() else []
    for old in runs[: max(0, len(runs) - keep)]:
        shutil.rmtree(old, ignore_errors=True)


class Scheduler:
    """Runs the job now or on a cron, one process per run, stoppable by a signal."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.stopping = threading.Event()
        self.child: subprocess.Popen[bytes] | None = None

    def command(self, out: Path) -> list[str]:
        command = [sys.executable, "-m", "jobs.recompute", "--bootstrap", self.args.bootstrap]
        command += ["--out", str(out)]
        if self.args.repair:
            command.append("--repair")
        command += ["--master", self.args.master]
        if self.args.views_root:  # the run's views beside the others', under its own name
            command += ["--views", f"{self.args.views_root.rstrip('/')}/{out.name}"]
        return command

    def run_once(self) -> int:
        out = self.args.out_root / datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        log(f"recompute starting: {' '.join(self.command(out))}")
        started = time.monotonic()
        self.child = subprocess.Popen(self.command(out))
        status = self.child.wait()
        self.child = None
        meaning = {0: "no differences", 3: "differences found"}.get(status, "FAILED")
        log(f"recompute finished in {time.monotonic() - started:.1f}s: exit {status} ({meaning})")
        log(f"report: {out / 'report.json'}")
        prune(self.args.out_root, self.args.keep)
        return status

    def run_forever(self) -> int:
        while not self.stopping.is_set():
            due = next_run(self.args.cron, datetime.now(UTC))
            log(f"next recompute at {due.isoformat()} (cron {self.args.cron!r})")
            while not self.stopping.is_set():
                left = (due - datetime.now(UTC)).total_seconds()
                if left <= 0:
                    break
                self.stopping.wait(min(left, 60.0))
            if not self.stopping.is_set():
                self.run_once()
        log("stopped")
        return 0

    def stop(self, signum: int, _frame: FrameType | None) -> None:
        log(f"signal {signum}: stopping")
        self.stopping.set()
        if self.child is not None and self.child.poll() is None:
            self.child.terminate()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    settings = Settings()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--once", action="store_true", help="run once now and exit")
    parser.add_argument("--cron", default=settings.nightly_cron, help="UTC cron expression")
    parser.add_argument("--bootstrap", default=settings.bootstrap_servers)
    parser.add_argument(
        "--out-root",
        type=Path,
        default=settings.nightly_reports,
        help=f"each run's folder goes here (STREAMSTATE_NIGHTLY_REPORTS, now "
        f"{str(settings.nightly_reports)!r}); the workers' console reads the newest report",
    )
    parser.add_argument("--repair", action="store_true", help="publish corrections")
    parser.add_argument(
        "--master",
        default=settings.spark_master,
        help=f"Spark master (STREAMSTATE_SPARK_MASTER, now {settings.spark_master!r})",
    )
    parser.add_argument(
        "--views-root",
        default=None,
        metavar="URI",
        help="where each run's Parquet views go, in a folder named like its run directory "
        "(default: in the run directory); on a cluster a place the executors share. "
        "--keep does not prune it",
    )
    parser.add_argument("--keep", type=int, default=14, help="run directories kept")
    args = parser.parse_args(argv)
    if not croniter.is_valid(args.cron):
        parser.error(f"not a cron expression: {args.cron!r}")
    return args


def main(argv: list[str] | None = None) -> int:
    scheduler = Scheduler(parse_args(argv))
    signal.signal(signal.SIGTERM, scheduler.stop)
    signal.signal(signal.SIGINT, scheduler.stop)
    if scheduler.args.once:
        return scheduler.run_once()
    return scheduler.run_forever()


if __name__ == "__main__":
    sys.exit(main())
