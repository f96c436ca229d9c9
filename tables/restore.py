"""Restore accounting: how long each restore took and how many changelog records it read.

faust's Recovery service restores the active partitions of every table after each
rebalance; this subclass times each restore and counts the records applied, logs one
line per restore and keeps the figures for ``/ready`` and ``/metrics``.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from faust.tables import TableManager
from faust.tables.recovery import Recovery

logger = logging.getLogger(__name__)


@dataclass
class RestoreStats:
    """Figures of the restores of this worker process."""

    restores: int = 0
    in_progress: bool = False
    started_at: float | None = None
    last_duration_s: float | None = None
    last_records: int = 0
    total_records: int = 0
    total_duration_s: float = 0.0
    records_by_table: Counter[str] = field(default_factory=Counter)
    standby_records: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "restores": self.restores,
            "in_progress": self.in_progress,
            "last_duration_s": self.last_duration_s,
            "last_records": self.last_records,
            "total_records": self.total_records,
            "records_by_table": dict(self.records_by_table),
            "standby_records": self.standby_records,
        }


class TrackedRecovery(Recovery):
    """faust's Recovery, timing each active restore and counting the records it read."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stats = RestoreStats()
        self._records_now = 0

    def count(self, table_name: str, *, active: bool) -> None:
        """Called once per changelog record that recovery hands to a table."""
        if active:
            self._records_now += 1
            self.stats.records_by_table[table_name] += 1
        else:
            self.stats.standby_records += 1

    def _set_recovery_started(self) -> None:
        super()._set_recovery_started()
        self._records_now = 0
        self.stats.in_progress = True
        self.stats.started_at = time.monotonic()

    def _set_recovery_ended(self) -> None:
        super()._set_recovery_ended()
        if not self.stats.in_progress or self.stats.started_at is None:
            return
        elapsed = time.monotonic() - self.stats.started_at
        stats = self.stats
        stats.in_progress = False
        stats.restores += 1
        stats.last_duration_s = elapsed
        stats.last_records = self._records_now
        stats.total_records += self._records_now
        stats.total_duration_s += elapsed
        rate = self._records_now / elapsed if elapsed > 0 else 0.0
        logger.info(
            "restore %d done: %d changelog records in %.3f s (%.0f records/s) for %d partitions",
            stats.restores,
            self._records_now,
            elapsed,
            rate,
            len(self.active_tps),
        )


class StreamstateTableManager(TableManager):
    """TableManager whose recovery is a :class:`TrackedRecovery`."""

    @property
    def recovery(self) -> TrackedRecovery:
        if self._recovery is None:
            self._recovery = TrackedRecovery(self.app, self, beacon=self.beacon, loop=self.loop)
        return self._recovery  # type: ignore[return-value]
