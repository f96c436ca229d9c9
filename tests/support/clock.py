"""A clock the test moves: the engine's backoffs pass at once."""

from __future__ import annotations

import time


class Clock:
    """Stands in for the ``time`` module of tables/engine.py, tables/task.py and
    tables/stalls.py."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return time.time() + self.now - 1000.0

    def advance(self, seconds: float) -> None:
        self.now += seconds
