"""The engine's figures sampled over time, so that the console can show rates.

The engine keeps running totals (:class:`tables.engine.Figures`); once a second a
:class:`FigureSampler` copies the totals the console shows and keeps the last few
minutes of copies. A rate is the change between the newest copy and the one about
``window_s`` older, divided by the time between them: a rate over a few seconds, fresh
every second, at the cost of copying a few small counters once a second.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from api.background import cancelled

#: (pipeline, topic or table) -> running total
Totals = Counter[tuple[str, str]]


@dataclass(frozen=True)
class Sample:
    """The totals at one moment (``at``: monotonic seconds; ``wall``: epoch seconds)."""

    at: float
    wall: float
    read: Totals = field(default_factory=Counter)
    written: Totals = field(default_factory=Counter)
    sent: Totals = field(default_factory=Counter)
    cycles: int = 0


def take(figures: Any, now: float | None = None, wall: float | None = None) -> Sample:
    """A copy of the figures' totals."""
    return Sample(
        time.monotonic() if now is None else now,
        time.time() if wall is None else wall,
        Counter(figures.read),
        Counter(figures.written),
        Counter(figures.sent),
        int(figures.cycles),
    )


def per_second(newer: Totals, older: Totals, seconds: float) -> dict[tuple[str, str], float]:
    """The rate of each total between two samples (a total that went down, as after a
    restart of the counting, counts from zero)."""
    if seconds <= 0:
        return {key: 0.0 for key in newer}
    rates = {}
    for key, total in newer.items():
        before = older.get(key, 0)
        moved = total - before if total >= before else total
        rates[key] = moved / seconds
    return rates


@dataclass(frozen=True)
class WindowRates:
    """Rates over one window: per (pipeline, topic) read and sent, per (pipeline, table)
    written, and the window's length in seconds."""

    read: dict[tuple[str, str], float]
    written: dict[tuple[str, str], float]
    sent: dict[tuple[str, str], float]
    seconds: float

    def total_read(self) -> float:
        return sum(self.read.values())

    def total_sent(self) -> float:
        return sum(self.sent.values())


class FigureSampler:
    """Copies the figures every ``interval`` seconds and answers rates over the last
    ``window_s`` seconds and a short history of the totals' rates."""

    def __init__(
        self,
        figures: Callable[[], Any],
        *,
        interval: float = 1.0,
        window_s: float = 5.0,
        keep: int = 180,
    ) -> None:
        self.figures = figures
        self.interval = interval
        self.window_s = window_s
        self.samples: deque[Sample] = deque(maxlen=keep)
        self._task: asyncio.Task[None] | None = None

    def sample(self, now: float | None = None, wall: float | None = None) -> None:
        self.samples.append(take(self.figures(), now, wall))

    def flow(self) -> WindowRates:
        """Rates between the newest sample and the newest one at least ``window_s``
        older (or the oldest there is)."""
        if len(self.samples) < 2:
            return WindowRates({}, {}, {}, 0.0)
        newest = self.samples[-1]
        older = self.samples[0]
        for sample in reversed(self.samples):
            if newest.at - sample.at >= self.window_s:
                older = sample
                break
        seconds = newest.at - older.at
        return WindowRates(
            per_second(newest.read, older.read, seconds),
            per_second(newest.written, older.written, seconds),
            per_second(newest.sent, older.sent, seconds),
            seconds,
        )

    def history(self, points: int = 60) -> list[dict[str, float]]:
        """Records/s read and sent by this worker, per interval, for the last ``points``
        intervals: ``{"at": epoch seconds, "read": r/s, "sent": r/s}``."""
        samples = list(self.samples)[-(points + 1) :]
        found = []
        for older, newer in itertools.pairwise(samples):
            seconds = newer.at - older.at
            read = per_second(newer.read, older.read, seconds)
            sent = per_second(newer.sent, older.sent, seconds)
            found.append(
                {
                    "at": round(newer.wall, 3),
                    "read": round(sum(read.values()), 1),
                    "sent": round(sum(sent.values()), 1),
                }
            )
        return found

    def start(self) -> None:
        if self._task is None:
            self.sample()
            self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancelled(task)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            self.sample()
