"""The facts of the machine a run measured on."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

from bench.config import ROOT


def _first(path: str, prefix: str) -> str | None:
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(prefix):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def _java() -> str | None:
    try:
        done = subprocess.run(["java", "-version"], capture_output=True, text=True, check=False)
    except OSError:
        return None
    lines = (done.stderr or done.stdout).splitlines()
    return lines[0].strip() if lines else None


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _git_commit() -> str | None:
    done = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    )
    return done.stdout.strip() or None


def _uncommitted() -> list[str]:
    """Tracked files of the project with uncommitted changes (they were measured too)."""
    done = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    return sorted(line[3:] for line in done.stdout.splitlines() if line[3:])


def memory_gib() -> float | None:
    total = _first("/proc/meminfo", "MemTotal")
    return round(int(total.split()[0]) / 1024 / 1024, 1) if total else None


def facts(kafka_version: str) -> dict[str, Any]:
    """Cores, memory, CPU model, versions and the load average at the start."""
    return {
        "cores": os.cpu_count(),
        "memory_gib": memory_gib(),
        "cpu_model": _first("/proc/cpuinfo", "model name") or platform.processor(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "java": _java(),
        "kafka": kafka_version,
        "faust_streaming": _version("faust-streaming"),
        "aiokafka": _version("aiokafka"),
        "pyspark": _version("pyspark"),
        "git_commit": _git_commit(),
        "uncommitted_changes": _uncommitted(),
        "started_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "loadavg_start": [round(x, 2) for x in os.getloadavg()],
        "cpu_ticks_start": cpu_ticks(),
    }


def finish(machine: dict[str, Any], elapsed_s: float) -> None:
    machine["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    machine["run_s"] = round(elapsed_s, 1)
    machine["steal_share"] = steal_share(machine.pop("cpu_ticks_start", None), cpu_ticks())


def cpu_ticks(stat: str = "/proc/stat") -> tuple[int, int] | None:
    """(steal, all) CPU ticks of every core since boot, or None where the kernel does not
    say. Steal is time the hypervisor gave this machine's virtual CPUs to others."""
    try:
        fields = Path(stat).read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return None
    if len(fields) < 9 or fields[0] != "cpu":
        return None
    # user nice system idle iowait irq softirq steal (guest time is counted in user)
    ticks = [int(v) for v in fields[1:9]]
    return ticks[7], sum(ticks)


def steal_share(before: Any, after: tuple[int, int] | None) -> float | None:
    """The share of the machine's CPU time stolen between two :func:`cpu_ticks`."""
    if not before or after is None:
        return None
    elapsed = after[1] - before[1]
    return round((after[0] - before[0]) / elapsed, 4) if elapsed > 0 else None
