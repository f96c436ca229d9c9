"""Partitions that cannot advance: where each is stuck, how often it failed, when it
tries again, and what ``/ready`` and ``/metrics`` say of it.

The rules (how long a stalled task waits, when its records go one per record batch,
when a cycle in flight counts as stalled) are the engine's commit cycle's
(:meth:`tables.engine.Engine._stall`); a :class:`Stall` keeps their outcome.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tables.refusals import Partition, Plan


@dataclass
class Stall:
    """A partition whose last attempt at its cycle failed."""

    partition: int
    #: what the last failure said, and the name of its error
    reason: str
    error: str
    #: per source partition, the offset the task is stuck at (the next one to apply)
    inputs: dict[Partition, int | None]
    attempts: int = 0
    since: float = field(default_factory=lambda: time.monotonic())
    since_ms: int = field(default_factory=lambda: int(time.time() * 1000))
    retry_at: float = 0.0
    #: the source partitions are paused until the retry is due
    paused: bool = False
    #: what the cycle learned so far (culprits found survive the retry)
    plan: Plan = field(default_factory=Plan)
    #: partitions whose record batches Kafka failed in the last attempt
    failed: set[Partition] = field(default_factory=set)

    def failed_again(self, reason: str, error: str, retry_at: float) -> None:
        """Count one more failed attempt; the next one is due at ``retry_at``."""
        self.attempts += 1
        self.reason, self.error = reason, error
        self.retry_at = retry_at

    def due(self, now: float) -> bool:
        return now >= self.retry_at

    def report(self, now: float) -> dict[str, Any]:
        """What /ready and /metrics say of it."""
        return {
            "partition": self.partition,
            "inputs": _inputs(self.inputs),
            "reason": self.reason,
            "error": self.error,
            "attempts": self.attempts,
            "stalled_s": round(now - self.since, 1),
            "since_ms": self.since_ms,
            "retry_in_s": round(max(0.0, self.retry_at - now), 1),
        }


def slow_report(
    partition: int, inputs: Mapping[Any, int | None], busy_s: float, waiting: bool
) -> dict[str, Any]:
    """The report of a task whose cycle has been in flight for ``busy_s`` seconds:
    ``waiting`` for Kafka to take its records, or applying them (``Busy``)."""
    doing = "waited for Kafka to take its records" if waiting else "applied its records"
    return {
        "partition": partition,
        "inputs": _inputs(inputs),
        "reason": f"the cycle in flight has {doing} for {busy_s:.0f} s",
        "error": "Waiting" if waiting else "Busy",
        "attempts": 0,
        "stalled_s": round(busy_s, 1),
        "since_ms": int(time.time() * 1000 - busy_s * 1000),
        "retry_in_s": 0.0,
    }


def _inputs(inputs: Mapping[Any, int | None]) -> dict[str, int | None]:
    return {topic: offset for (topic, _p), offset in sorted(inputs.items())}
