"""The last rebalances of a worker and how long each paused its processing.

aiokafka speaks only the eager protocol: every rebalance revokes every partition, so the
engine processes nothing from the moment a rebalance starts (faust's
``on_rebalance_start``, called as the partitions are revoked) until it ends (its
``on_rebalance_end``, once the new assignment's tables are restored). That span is the
pause; the join is the part until the group answered the new assignment
(``on_rebalance_return``). :class:`RebalanceLog` is a faust sensor (``app.sensors.add``):
faust calls it at those three moments.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from faust.sensors import Sensor


@dataclass
class Rebalance:
    """One rebalance; times in epoch seconds, durations in seconds."""

    number: int
    started_at: float
    returned_at: float | None = None
    ended_at: float | None = None
    #: the group generation the worker joined, once it returned
    generation: int | None = None
    _started: float = 0.0
    join_s: float | None = None
    paused_s: float | None = None

    def as_dict(self, now: float | None = None) -> dict[str, Any]:
        """The rebalance as JSON; one still running pauses until ``now``."""
        paused = self.paused_s
        if paused is None:
            paused = (time.monotonic() if now is None else now) - self._started
        return {
            "number": self.number,
            "started_at": round(self.started_at, 3),
            "returned_at": None if self.returned_at is None else round(self.returned_at, 3),
            "ended_at": None if self.ended_at is None else round(self.ended_at, 3),
            "generation": self.generation,
            "join_s": None if self.join_s is None else round(self.join_s, 3),
            "paused_s": round(paused, 3),
            "in_progress": self.ended_at is None,
        }


class RebalanceLog(Sensor):
    """Keeps the last ``keep`` rebalances of this worker."""

    def __init__(self, keep: int = 20, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.rebalances: deque[Rebalance] = deque(maxlen=keep)
        self.count = 0
        # faust calls the start from the consumer's thread, the rest from the worker's.
        self._lock = threading.Lock()

    def on_rebalance_start(self, app: Any) -> dict[str, Any]:
        with self._lock:
            self.count += 1
            rebalance = Rebalance(self.count, time.time(), _started=time.monotonic())
            self.rebalances.append(rebalance)
        return {"rebalance": rebalance}

    def on_rebalance_return(self, app: Any, state: dict[str, Any]) -> None:
        rebalance: Rebalance | None = state.get("rebalance")
        if rebalance is None:
            return
        rebalance.returned_at = time.time()
        rebalance.join_s = time.monotonic() - rebalance._started
        generation = getattr(app, "consumer_generation_id", None)
        rebalance.generation = generation if isinstance(generation, int) else None

    def on_rebalance_end(self, app: Any, state: dict[str, Any]) -> None:
        rebalance: Rebalance | None = state.get("rebalance")
        if rebalance is None:
            return
        rebalance.ended_at = time.time()
        rebalance.paused_s = time.monotonic() - rebalance._started

    def last(self, now: float | None = None) -> list[dict[str, Any]]:
        """The kept rebalances, newest first."""
        with self._lock:
            kept = list(self.rebalances)
        return [r.as_dict(now) for r in reversed(kept)]


def attach(app: Any, log: RebalanceLog) -> None:
    """Add ``log`` to ``app``'s sensors, also while a rebalance is under way.

    faust hands every sensor, at the end of a rebalance, the state it returned at the
    start, looked up by sensor: one added between the two (the API starts while the first
    rebalance runs) would make faust's lookup raise KeyError and crash the worker. Such a
    sensor is given its state as if it had seen the start.
    """
    app.sensors.add(log)
    state = getattr(app, "_rebalancing_sensor_state", None)
    if isinstance(state, dict) and log not in state:
        state[log] = log.on_rebalance_start(app)
