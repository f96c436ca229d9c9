"""Partitions that cannot advance: why, where, and when their task tries again.

A task whose cycle fails for a reason that is not a record's (Kafka unreachable, a
producer fenced, an error no record explains) closes; its source partitions pause and
its cycle is tried again later, from the committed offsets, after a backoff that doubles
with every failed attempt up to :data:`BACKOFF_CAP_S`. The other tasks of the worker go
on. After :data:`ISOLATE_AFTER` failed attempts of one cycle, the next attempts send the
records of the partitions Kafka failed one per record batch: if Kafka then refuses some
records and takes others, the refused ones are the records' problem, and their inputs go
to the dead-letter topics (:mod:`tables.refusals`).

Under ``at_least_once`` each attempt sends the cycle's outputs again (Kafka may have
taken some of them before the failure): at most once more per attempt.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tables.refusals import Partition, Plan

#: The first retry waits this long; each further one twice as long, up to the cap.
BACKOFF_BASE_S = 1.0
BACKOFF_CAP_S = 30.0
#: Failed attempts of one cycle before its records are sent one per batch.
ISOLATE_AFTER = 3
#: A cycle in flight this long shows as stalled too (waiting on Kafka, or applying a
#: large fetch in checked batches).
SLOW_CYCLE_S = 10.0


def backoff(attempts: int) -> float:
    """Seconds before attempt ``attempts + 1``, after ``attempts`` failed ones."""
    return float(min(BACKOFF_BASE_S * 2 ** max(attempts - 1, 0), BACKOFF_CAP_S))


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

    def failed_again(self, reason: str, error: str, now: float) -> float:
        """Count one more failed attempt; the seconds until the next one."""
        self.attempts += 1
        self.reason, self.error = reason, error
        wait = backoff(self.attempts)
        self.retry_at = now + wait
        if self.attempts >= ISOLATE_AFTER:
            self.plan.isolate |= self.failed
        return wait

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
