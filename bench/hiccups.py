"""How steadily this machine runs a bare compute loop: the floor under any tail latency.

A process pinned to one core repeats a fixed unit of arithmetic for a few seconds and
counts the units done in each 10-ms window. A window in which fewer than half the median
number of units were done is *slow*: the core ran the loop at under half its speed then,
for reasons outside the loop (the kernel, another process on the core, or the hypervisor
taking the virtual CPU away without counting it as steal). A request in flight during a
run of slow windows waits for it, whatever the server does, so a read's p99 cannot be
measured below the machine's slow runs when they cover more than 1% of the time.

Run as ``python -m bench.hiccups [seconds]``: prints one JSON line (:func:`summarize`).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import orjson

#: The width of a window, in seconds.
WINDOW_S = 0.01


def _unit() -> int:
    total = 0
    for i in range(400):
        total += i * i
    return total


def units_per_window(duration_s: float, window_s: float = WINDOW_S) -> list[int]:
    """Units of work done in each window of ``window_s`` over ``duration_s``."""
    counts = [0] * max(1, int(duration_s / window_s))
    started = time.perf_counter()
    while True:
        index = int((time.perf_counter() - started) / window_s)
        if index >= len(counts):
            return counts
        _unit()
        counts[index] += 1


def summarize(counts: list[int], window_s: float = WINDOW_S) -> dict[str, Any]:
    """Of the windows' unit counts: the median; the share of slow windows (fewer than
    half the median units); the longest run of consecutive slow windows and the number
    of such runs, in ms and per second of the probe."""
    if not counts:
        raise ValueError("no window to summarize")
    median = sorted(counts)[len(counts) // 2]
    slow = [count * 2 < median for count in counts]
    runs: list[int] = []
    length = 0
    for is_slow in [*slow, False]:
        if is_slow:
            length += 1
        elif length:
            runs.append(length)
            length = 0
    seconds = len(counts) * window_s
    return {
        "windows": len(counts),
        "window_ms": window_s * 1000,
        "median_units": median,
        "slow_share": sum(slow) / len(counts),
        "longest_slow_ms": max(runs, default=0) * window_s * 1000,
        "slow_runs_per_s": len(runs) / seconds,
    }


def main(argv: list[str]) -> int:
    duration_s = float(argv[0]) if argv else 5.0
    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cores[0]})
    result = summarize(units_per_window(duration_s))
    result["core"] = cores[0]
    sys.stdout.write(orjson.dumps(result).decode() + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
