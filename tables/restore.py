"""Restores: which changelog partitions to read in bulk, how a run is written, and the
figures of the restores (the recovery that uses them is
``tables.faust_adapter.TrackedRecovery``)."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from faust.types import TP

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
    #: of ``standby_records``: written as fetched, one write batch per fetched run
    standby_written_records: int = 0
    bulk_records: int = 0
    bulk_duration_s: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "restores": self.restores,
            "in_progress": self.in_progress,
            "last_duration_s": self.last_duration_s,
            "last_records": self.last_records,
            "total_records": self.total_records,
            "records_by_table": dict(self.records_by_table),
            "standby_records": self.standby_records,
            "standby_written_records": self.standby_written_records,
            "bulk_records": self.bulk_records,
            "bulk_duration_s": self.bulk_duration_s,
        }


def bulk_plan(
    starts: Mapping[TP, int | None], highwaters: Mapping[TP, int | None], min_records: int
) -> dict[TP, tuple[int, int]]:
    """The partitions worth a bulk read: ``tp -> (first offset, end offset)``.

    ``starts`` are faust's last applied changelog offsets (``-1`` or ``None``: nothing
    applied); ``highwaters`` are faust's highwaters (the last offset, ``-1`` for an
    empty partition). A partition qualifies when at least ``min_records`` offsets lie
    between the two.
    """
    plan: dict[TP, tuple[int, int]] = {}
    for tp, highwater in highwaters.items():
        if highwater is None or highwater < 0:
            continue
        start = starts.get(tp)
        first = 0 if start is None or start < 0 else start + 1
        end = highwater + 1
        if end - first >= max(min_records, 1):
            plan[tp] = (first, end)
    return plan
