"""The load a scenario offers: its level, and the generator process that offers it.

The full run offers each loaded scenario's group half of what it sustains: a calibration
phase (chaos/session.py) first offers the rates of the latest committed ``make bench`` run
(``bench/results/summary.json``, half of what one worker processed of each pipeline),
text lines and item events at the same time with payments for about half of the sales,
which is more than a group on this machine keeps up with, and measures what the group
processes of it. ``CHAOS_LINES_PER_S`` / ``CHAOS_EVENTS_PER_S`` (or ``python -m chaos
--lines-per-s/--events-per-s``) set fixed rates instead; the CI-sized suite uses a small
fixed level.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
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
    """Offered rates, and where they come from. With ``share`` set, the rates are the
    calibration's: a scenario offers ``share`` of what its group processed of them."""

    lines_per_s: float
    events_per_s: float
    source: str
    share: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "lines_per_s": self.lines_per_s,
            "events_per_s": self.events_per_s,
            "source": self.source,
            **({"share_of_sustained": self.share} if self.share is not None else {}),
        }

    def scaled(self, lines_per_s: float, events_per_s: float, source: str) -> LoadLevel:
        """``share`` of a measured sustained rate, as a fixed level."""
        share = self.share if self.share is not None else 1.0
        return LoadLevel(round(lines_per_s * share), round(events_per_s * share), source)


#: The CI-sized level: enough to keep batches and transactions in flight at every kill.
CI_LEVEL = LoadLevel(4000.0, 400.0, "the CI-sized level (fixed)")


#: The share of what a scenario's group sustains that the full run offers it.
SUSTAINED_SHARE = 0.5


def bench_level(
    path: Path = BENCH_SUMMARY, fraction: float = BENCH_FRACTION, share: float | None = None
) -> LoadLevel:
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
        share,
    )


def level(quick: bool, lines: float | None = None, events: float | None = None) -> LoadLevel:
    """The level of a run: explicit figures, else the environment, else the CI level
    (quick), else the calibration's (the full run: each scenario offers half of what its
    group sustains of the bench's rates)."""
    base = CI_LEVEL if quick else bench_level(share=SUSTAINED_SHARE)
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
    running_s: float = 0.0
    #: (running seconds at its end, seconds) of each stall of the generator
    stalls: list[tuple[float, float]] = field(default_factory=list)
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
            running_s=float(report["running_s"]),
            stalls=[(float(at), float(s)) for at, s in report["stalls"]],
            skipped_s=float(report["skipped_s"]),
        )

    @property
    def acked_total(self) -> int:
        return sum(self.acked.values())

    def until(self, later: LoadFigures) -> LoadFigures:
        """What the generator did from these figures to ``later`` (acknowledged records,
        wall time and stalls), as figures that start from nothing."""
        return LoadFigures(
            acked={t: n - self.acked.get(t, 0) for t, n in later.acked.items()},
            failed={t: n - self.failed.get(t, 0) for t, n in later.failed.items()},
            running_s=later.running_s - self.running_s,
            stalls=[(at - self.running_s, s) for at, s in later.stalls if at > self.running_s],
            skipped_s=later.skipped_s - self.skipped_s,
        )

    def __add__(self, other: LoadFigures) -> LoadFigures:
        """Two stretches of the generator's work, one after the other."""
        topics = set(self.acked) | set(other.acked)
        return LoadFigures(
            acked={t: self.acked.get(t, 0) + other.acked.get(t, 0) for t in topics},
            failed={
                t: self.failed.get(t, 0) + other.failed.get(t, 0)
                for t in set(self.failed) | set(other.failed)
            },
            running_s=self.running_s + other.running_s,
            stalls=[*self.stalls, *((at + self.running_s, s) for at, s in other.stalls)],
            skipped_s=self.skipped_s + other.skipped_s,
        )

    def since(self, earlier: LoadFigures) -> dict[str, Any]:
        """What was offered between ``earlier`` and these figures: records acknowledged
        per second of wall time the generator was asked to offer (stalls included), and
        its stalls."""
        running = self.running_s - earlier.running_s
        stalls = [s for at, s in self.stalls if at > earlier.running_s]

        def rate(topic: str) -> float | None:
            acked = self.acked.get(topic, 0) - earlier.acked.get(topic, 0)
            return round(acked / running) if running > 0 else None

        return {
            "running_s": round(running, 1),
            "offered_lines_per_s": rate("text-lines"),
            "offered_events_per_s": rate("item-events"),
            "offered_payments_per_s": rate("payments"),
            "records_acked": self.acked_total - earlier.acked_total,
            "records_failed": sum(self.failed.values()) - sum(earlier.failed.values()),
            "stalls": len(stalls),
            "stalled_s": round(self.skipped_s - earlier.skipped_s, 2),
            "longest_stall_s": max(stalls, default=0.0),
        }


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
            self._events[command.split()[0]] = done
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

    def wait_offering(self, timeout: float = 120.0) -> LoadFigures:
        """The generator's first figures that show it offering (it reports once a
        second): its process has started and connected."""
        deadline = time.monotonic() + timeout
        while self.figures.running_s <= 0:
            if not self.alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the load generator offered nothing in {timeout:g} s")
            time.sleep(0.05)
        return self.figures

    def rate(self, level: LoadLevel) -> LoadFigures:
        """Offer ``level``'s rates from now on."""
        return self._command(f"rate {level.lines_per_s} {level.events_per_s}", 30.0)

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
