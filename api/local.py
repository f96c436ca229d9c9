"""Reads of the partitions this worker holds, one partition database at a time.

A plain faust table read outside a stream searches every open partition database,
standbys included, so it can answer a key of another partition with stale data. Here a
read names its partition, opens only a partition this worker is assigned (active or
standby), and says which kind of copy answered and how far behind its changelog it is:
``highwater - 1 - persisted_offset`` (the last offset written to RocksDB).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from api.errors import NotHeldHere
from api.routing import QueryTable
from tables.engine import TP
from tables.membership import Membership
from tables.pipeline import StorePartition
from tables.windows import key_prefix, name_prefix, parse_window_range, window_end_ms

Replica = Literal["active", "standby"]


@dataclass(frozen=True)
class Window:
    """One window of a key: ``[start, end)`` in epoch milliseconds, and its table key."""

    start: int
    end: int
    value: Any
    raw_key: bytes = b""

    def as_dict(self) -> dict[str, Any]:
        return {"start": self.start, "end": self.end, "value": self.value}


@dataclass
class LocalCopy:
    """An open partition database of this worker and what kind of copy it is."""

    table: QueryTable
    partition: int
    replica: Replica
    #: what :attr:`offset_lag` asks, on first use (it reads the store and the consumer)
    lag: Callable[[], int | None]
    #: the partition as the engine's store gives it, internal keys hidden
    data: StorePartition

    @functools.cached_property
    def offset_lag(self) -> int | None:
        """Changelog records not yet in this copy (0 for a restored active copy); None
        while the changelog's end is unknown."""
        return self.lag()

    def get(self, key: bytes) -> Any | None:
        self._check_held()
        raw = self.data.get(key)
        return None if raw is None else orjson.loads(raw)

    def stored_position(self) -> bytes | None:
        """The encoded position this copy holds (:mod:`tables.positions`)."""
        self._check_held()
        assert self.table.store is not None
        return self.table.store.position(self.partition)

    def _check_held(self) -> None:
        """A rebalance may close the copy's database while a read waits (for a peer or a
        position): the read then turns to another copy."""
        assert self.table.store is not None
        if not self.table.store.held(self.partition):
            raise NotHeldHere(
                f"this worker's copy of {self.table.name} partition {self.partition} was "
                "closed by a rebalance"
            )

    def windows(self, key: str) -> list[Window]:
        """Every retained window of ``key``, oldest first."""
        self._check_held()
        prefix = key_prefix(key)
        found = [window for name, window in self._windowed_items(prefix) if name == key]
        return sorted(found, key=_start)

    def scan(self, prefix: bytes, after: bytes | None, limit: int) -> tuple[list[Any], bool]:
        """Up to ``limit`` (key, value) pairs after ``after`` whose key starts with
        ``prefix``, in key order, and whether more follow."""
        self._check_held()
        if self.table.kind == "windowed":
            return self._scan_windowed(prefix, after, limit)
        start = prefix if after is None or after < prefix else after
        items: list[Any] = []
        for raw_key, raw_value in self.data.items(start):
            if not raw_key.startswith(prefix):
                break
            if raw_key == after:
                continue
            if len(items) == limit:
                return items, True
            items.append((raw_key, orjson.loads(raw_value)))
        return items, False

    def _scan_windowed(
        self, prefix: bytes, after: bytes | None, limit: int
    ) -> tuple[list[Any], bool]:
        # JSON keys sort differently from raw keys once escapes appear: collect, then sort.
        grouped: dict[bytes, list[Window]] = {}
        for name, window in self._windowed_items(name_prefix(prefix.decode("utf-8"))):
            raw = name.encode("utf-8")
            if raw.startswith(prefix) and (after is None or raw > after):
                grouped.setdefault(raw, []).append(window)
        keys = sorted(grouped)
        items = [(k, [w.as_dict() for w in sorted(grouped[k], key=_start)]) for k in keys[:limit]]
        return items, len(keys) > limit

    def _windowed_items(self, seek: bytes) -> Iterator[tuple[str, Window]]:
        """The windows from ``seek`` on, but those past the table's retention: they are
        expired, though their partition removes them only at its next write."""
        window = self.table.window
        assert window is not None
        retention = self.table.retention_ms
        horizon = None if retention is None else int(time.time() * 1000) - retention
        for raw_key, raw_value in self.data.items(seek):
            if not raw_key.startswith(seek):
                break
            parsed = parse_window_range(raw_key)
            if parsed is None:
                continue
            name, start_ms, end_s = parsed
            end = window_end_ms(window, start_ms, end_s)
            if horizon is not None and end <= horizon:
                continue
            yield name, Window(start_ms, end, orjson.loads(raw_value), raw_key)


def _start(window: Window) -> int:
    return window.start


def _none_behind() -> int:
    return 0


class LocalState:
    """The partition copies of one worker, read through the engine's stores."""

    def __init__(self, membership: Membership) -> None:
        self.membership = membership

    def copy(self, table: QueryTable, partition: int) -> LocalCopy | None:
        """This worker's copy of a partition, or None when it holds none."""
        tp = TP(table.topic, partition)
        assignment = self.membership.assignment()
        if assignment is None or table.store is None:
            return None
        active = tp in assignment.actives
        standby = not active and tp in assignment.standbys
        if not (active or standby) or not table.store.held(partition):
            return None
        try:
            data = table.store.partition(partition)
        except Exception:  # still locked by a revoked handle during a rebalance
            return None
        if active and not self._restoring(tp):
            # The active copy is written before its changelog: nothing is newer.
            return LocalCopy(table, partition, "active", _none_behind, data)
        return LocalCopy(table, partition, "standby", functools.partial(self.lag, table, tp), data)

    def lag(self, table: QueryTable, tp: TP) -> int | None:
        """Changelog records not yet in this copy; None while the highwater is unknown."""
        highwater = self._highwater(tp)
        if highwater is None or table.store is None:
            return None
        persisted = table.store.persisted_offset(tp.partition)
        last = -1 if persisted is None else persisted
        return max(0, highwater - 1 - last)

    def _restoring(self, tp: TP) -> bool:
        # While the group rebalances and restores, an active copy may have just been
        # assigned here and not be restored yet: it answers as a standby, with its lag.
        return self.membership.rebalancing

    def _highwater(self, tp: TP) -> int | None:
        found = self.membership.highwater(tp)
        return found if found is not None else self.membership.restore_highwater(tp)
