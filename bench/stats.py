"""Pure helpers: percentiles, rates over time series."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100) by linear interpolation between closest ranks."""
    if not values:
        return None
    ordered = sorted(values)
    if len(ordered) == 1:
        return float(ordered[0])
    rank = (len(ordered) - 1) * q / 100.0
    low, high = math.floor(rank), math.ceil(rank)
    fraction = rank - low
    return float(ordered[low] + (ordered[high] - ordered[low]) * fraction)


def percentiles(values: Sequence[float], qs: Sequence[float]) -> dict[str, float | None]:
    """Several percentiles at once, keyed like ``p50``, ``p99``, ``p99.9``."""
    ordered = sorted(values)
    return {f"p{q:g}": percentile(ordered, q) for q in qs}


def steady_rate(series: Sequence[tuple[float, float]]) -> float | None:
    """Units per second between the first sample with progress and the last sample.

    ``series`` holds (seconds, cumulative units). Starting at the first progress
    leaves out process start-up and the first commit interval.
    """
    started = [(t, v) for t, v in series if v > 0]
    if len(started) < 2:
        return None
    (t0, v0), (t1, v1) = started[0], started[-1]
    if v1 == v0:  # one commit seen: no interval to measure over
        return None
    return (v1 - v0) / (t1 - t0) if t1 > t0 else None


def completion_rate(
    source_series: Sequence[tuple[float, float]], total: float, end_s: float
) -> float | None:
    """Records per second from the first commit on the source topic to ``end_s``, the
    moment all ``total`` records were committed through every stage.

    The records committed at that first commit count as done before it: the window
    starts once processing has started and ends when the last stage has committed.
    """
    started = [(t, v) for t, v in source_series if v > 0]
    if not started:
        return None
    t0, v0 = started[0]
    return (total - v0) / (end_s - t0) if end_s > t0 and total > v0 else None


def instant_rates(series: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """(midpoint seconds, units per second) between consecutive samples whose value moved.

    Samples of committed offsets move in steps (one per commit), so a rate is taken
    between consecutive distinct values rather than between raw polls.
    """
    moved: list[tuple[float, float]] = []
    for t, v in series:
        if not moved or v != moved[-1][1]:
            moved.append((t, v))
    return [
        ((t0 + t1) / 2, (v1 - v0) / (t1 - t0))
        for (t0, v0), (t1, v1) in itertools.pairwise(moved)
        if t1 > t0
    ]


def ratio(value: float | None, base: float | None) -> float | None:
    if value is None or base is None or base == 0:
        return None
    return value / base
