"""The load a scenario offers: its level, and the generator process that offers it.

The level comes from the latest committed ``make bench`` run
(``bench/results/summary.json``): half of what one worker processed of each pipeline on
this machine, text lines and item events at the same time, with payments for about half
of the sales. ``CHAOS_LINES_PER_S`` / ``CHAOS_EVENTS_PER_S`` (or ``python -m chaos
--lines-per-s/--events-per-s``) override it; the CI-sized suite uses a small fixed level.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from chaos.loadgen import LEDGER_ENTRY, TOPICS
from tests.support.kafka import ROOT

BENCH_SUMMARY = ROOT / "bench" / "results" / "summary.json"
#: The share of the bench's throughput the full run offers.
BENCH_FRACTION = 0.5


@dataclass(frozen=True)
class LoadLevel:
    """Offered rates, and where they come from."""

    lines_per_s: float
    events_per_s: float
    source: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "lines_per_s": self.lines_per_s,
            "events_per_s": self.events_per_s,
            "source": self.source,
        }


#: The CI-sized level: enough to keep batches and transactions in flight at every kill.
CI_LEVEL = LoadLevel(4000.0, 400.0, "the CI-sized level (fixed)")


def bench_level(path: Path = BENCH_SUMMARY, fraction: float = BENCH_FRACTION) -> LoadLevel:
    """``fraction`` of the word count and inventory rates of the latest bench run."""
    summary = json.loads(path.read_text())
    lines = float(summary["wordcount"]["events_per_s"])
    events = float(summary["inventory"]["events_per_s"])
    commit = summary.get("machine", {}).get("git_commit", "?")
    return LoadLevel(
        round(lines * fraction),
        round(events * fraction),
        f"{fraction:.0%} of make bench at {commit} (word count {lines:,.0f} lines/s, "
        f"inventory {events:,.0f} events/s)",
    )


def level(quick: bool, lines: float | None = None, events: float | None = None) -> LoadLevel:
    """The level of a run: explicit figures, else the environment, else the bench's
    (the full run) or the CI level (quick)."""
    base = CI_LEVEL if quick else bench_level()
    lines = lines or _env_float("CHAOS_LINES_PER_S")
    events = events or _env_float("CHAOS_EVENTS_PER_S")
    if lines is None and events is None:
        return base
    return LoadLevel(
        lines if lines is not None else base.lines_per_s,
        events if events is not None else base.events_per_s,
        "set by the operator (CHAOS_LINES_PER_S / CHAOS_EVENTS_PER_S or flags)",
    )


def _env_float(name: str) -> float | None:
    raw = os.environ.get(name)
    return float(raw) if raw else None


@dataclass
class LoadFigures:
    """The generator's latest report."""

    active_s: float = 0.0
    clock_ms: int = 0
    offered: dict[str, int] = field(default_factory=dict)
    acked: dict[str, int] = field(default_factory=dict)
    failed: dict[str, int] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)
    skipped_s: float = 0.0

    @classmethod
    def of(cls, report: dict[str, Any]) -> LoadFigures:
        return cls(
            active_s=float(report["active_s"]),
            clock_ms=int(report["clock_ms"]),
            offered=dict(report["offered"]),
            acked=dict(report["acked"]),
            failed=dict(report["failed"]),
            errors=dict(report["errors"]),
            skipped_s=float(report["skipped_s"]),
        )

    @property
    def acked_total(self) -> int:
        return sum(self.acked.values())


class LoadProcess:
    """``python -m chaos.loadgen`` as a child process, steered through its stdin.

    The event clock starts ``lead_s`` of event time in the past, runs ``speed`` times
    faster than the load's active time, and stays within minutes of the wall clock.
    """

    def __init__(
        self,
        bootstrap: str,
        load: LoadLevel,
        workdir: Path,
        *,
        seed: int = 1,
        run_id: str = "r1",
        clock_start_ms: int,
        clock_speed: float,
    ) -> None:
        self.ledger = workdir / f"ledger-{run_id}.bin"
        self.ledger.unlink(missing_ok=True)
        self.log = workdir / f"loadgen-{run_id}.log"
        command = [
            sys.executable,
            "-m",
            "chaos.loadgen",
            "--bootstrap",
            bootstrap,
            "--ledger",
            str(self.ledger),
            "--lines-per-s",
            str(load.lines_per_s),
            "--events-per-s",
            str(load.events_per_s),
            "--clock-start-ms",
            str(clock_start_ms),
            "--clock-speed",
            str(clock_speed),
            "--seed",
            str(seed),
            "--run-id",
            run_id,
        ]
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                command, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log
            )
        self.figures = LoadFigures()
        self._events: dict[str, threading.Event] = {}
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, name="loadgen-reports", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        stdout: IO[bytes] | None = self.process.stdout
        assert stdout is not None
        for line in stdout:
            report = json.loads(line)
            with self._lock:
                self.figures = LoadFigures.of(report)
                done = self._events.pop(report["event"], None)
            if done is not None:
                done.set()

    def _command(self, command: str, timeout: float) -> LoadFigures:
        done = threading.Event()
        with self._lock:
            self._events[command] = done
        stdin = self.process.stdin
        assert stdin is not None
        stdin.write(f"{command}\n".encode())
        stdin.flush()
        if not done.wait(timeout):
            raise TimeoutError(f"the load generator did not answer {command!r} in {timeout}s")
        return self.figures

    def pause(self, timeout: float = 180.0) -> LoadFigures:
        """Stop offering; returns once every batch in flight is acknowledged or failed."""
        return self._command("pause", timeout)

    def resume(self) -> LoadFigures:
        return self._command("resume", 30.0)

    def stop(self, timeout: float = 180.0) -> LoadFigures:
        """Stop the process (every batch in flight settled first); its last figures."""
        if self.process.poll() is None:
            stdin = self.process.stdin
            assert stdin is not None
            try:
                stdin.write(b"stop\n")
                stdin.close()
                self.process.wait(timeout)
            except (subprocess.TimeoutExpired, BrokenPipeError):
                self.process.kill()  # by its pid: it is our child
                self.process.wait(10)
        self._reader.join(10)
        return self.figures

    def alive(self) -> bool:
        return self.process.poll() is None


@dataclass(frozen=True)
class AckedBatch:
    """One acknowledged record batch: where it went and which sequence numbers it holds."""

    topic: str
    partition: int
    base_offset: int
    first_seq: int
    count: int


def acked_batches(ledger: Path) -> Iterator[AckedBatch]:
    """The ledger's entries, in the order they were acknowledged."""
    data = ledger.read_bytes() if ledger.exists() else b""
    usable = len(data) - len(data) % LEDGER_ENTRY.size
    for topic, partition, base, first, count in LEDGER_ENTRY.iter_unpack(data[:usable]):
        yield AckedBatch(TOPICS[topic], partition, base, first, count)
