"""Event-time windows: their kinds, the keys of a windowed table, and their expiry.

A windowed table keys each window of a key as JSON ``[key, [start_s, end_s]]``, byte for
byte as faust's windowed tables write them: ``start_s`` is the window's start in seconds
and ``end_s = start_s + size_s - 0.1`` for tumbling and hopping windows; a session's
``end_s`` is the time of its last record. So all windows of a key are found by the
prefix ``["key",[`` and come in the order of their start.

The engine's pipelines write these keys and the query layer seeks them; both take them
from here.

Windows are kept for their table's retention, measured on the wall clock as the nightly
job measures it: a window that ended before ``now - retention`` is deleted, and records
for it are not counted again. A window may also have a grace: a record that arrives when
its source partition's event time (the largest event time seen) has passed the window's
end by more than the grace is too late for it.
"""

from __future__ import annotations

import functools
import heapq
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal, Protocol

import orjson

WindowKind = Literal["tumbling", "hopping", "session"]


def milliseconds(value: int | float | timedelta | None, what: str) -> int | None:
    """A duration given as milliseconds or a timedelta, as whole milliseconds."""
    if value is None:
        return None
    ms = value.total_seconds() * 1000 if isinstance(value, timedelta) else value
    if isinstance(ms, bool) or not isinstance(ms, int | float) or ms < 0 or ms != int(ms):
        raise ValueError(f"{what}: {value!r} is not a duration in whole milliseconds >= 0")
    return int(ms)


class Window:
    """What every window kind has: a grace and a retention (None: the context's)."""

    kind: WindowKind
    grace: int | float | timedelta | None
    retention: int | float | timedelta | None

    @functools.cached_property
    def grace_ms(self) -> int | None:
        return milliseconds(self.grace, "grace")

    @functools.cached_property
    def retention_ms(self) -> int | None:
        return milliseconds(self.retention, "retention")

    def starts(self, ts: int) -> Iterable[int]:
        """The starts of the windows that hold event time ``ts``."""
        raise NotImplementedError

    def end(self, start: int) -> int:
        """The end (exclusive, ms) of the window starting at ``start``."""
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        """The window as JSON, for the API's table descriptions."""
        found: dict[str, Any] = {"kind": self.kind}
        for name in ("size_ms", "advance_ms", "gap_ms", "grace_ms", "retention_ms"):
            value = getattr(self, name, None)
            if value is not None:
                found[name] = value
        return found

    def _check(self) -> None:
        self.grace_ms, self.retention_ms  # noqa: B018 (checked at declaration)


@dataclass(frozen=True)
class Tumbling(Window):
    """Fixed windows of ``size``, one after another: ``[n * size, (n + 1) * size)``."""

    size: int | float | timedelta
    grace: int | float | timedelta | None = None
    retention: int | float | timedelta | None = None
    kind: WindowKind = field(init=False, default="tumbling")

    def __post_init__(self) -> None:
        if self.size_ms < 1000:
            raise ValueError(f"a tumbling window's size must be at least 1 s, not {self.size!r}")
        self._check()

    @functools.cached_property
    def size_ms(self) -> int:
        return milliseconds(self.size, "size") or 0

    def starts(self, ts: int) -> tuple[int]:
        return (ts - ts % self.size_ms,)

    def end(self, start: int) -> int:
        return start + self.size_ms


@dataclass(frozen=True)
class Hopping(Window):
    """Windows of ``size`` starting every ``advance``: a record is in about
    ``size / advance`` of them."""

    size: int | float | timedelta
    advance: int | float | timedelta
    grace: int | float | timedelta | None = None
    retention: int | float | timedelta | None = None
    kind: WindowKind = field(init=False, default="hopping")

    def __post_init__(self) -> None:
        size, advance = self.size_ms, self.advance_ms
        if size < 1000 or advance < 1000 or advance > size:
            raise ValueError(
                f"a hopping window needs 1 s <= advance <= size, not size={self.size!r} "
                f"advance={self.advance!r}"
            )
        self._check()

    @functools.cached_property
    def size_ms(self) -> int:
        return milliseconds(self.size, "size") or 0

    @functools.cached_property
    def advance_ms(self) -> int:
        return milliseconds(self.advance, "advance") or 0

    def starts(self, ts: int) -> list[int]:
        advance = self.advance_ms
        first = ((ts - self.size_ms) // advance + 1) * advance
        return list(range(max(first, 0), ts - ts % advance + 1, advance))

    def end(self, start: int) -> int:
        return start + self.size_ms


@dataclass(frozen=True)
class Session(Window):
    """Windows of activity: records of a key at most ``gap`` apart fall in one session,
    which grows and merges with its neighbours as records arrive."""

    gap: int | float | timedelta
    grace: int | float | timedelta | None = None
    retention: int | float | timedelta | None = None
    kind: WindowKind = field(init=False, default="session")

    def __post_init__(self) -> None:
        if self.gap_ms < 1:
            raise ValueError(f"a session window's gap must be positive, not {self.gap!r}")
        self._check()

    @functools.cached_property
    def gap_ms(self) -> int:
        return milliseconds(self.gap, "gap") or 0

    def starts(self, ts: int) -> tuple[int]:
        return (ts,)

    def end(self, start: int) -> int:
        return start + 1


AnyWindow = Tumbling | Hopping | Session


# -- keys -------------------------------------------------------------------------------


def window_range(start_ms: int, size_s: float) -> tuple[float, float]:
    """The range faust keys a window by (``end = start + size - 0.1``)."""
    start = start_ms / 1000
    return (start, start + size_s - 0.1)


def window_key(key: str, start_ms: int, size_s: float) -> bytes:
    """The table key of one fixed-size window of ``key``."""
    return orjson.dumps([key, list(window_range(start_ms, size_s))])


def session_key(key: str, start_ms: int, end_ms: int) -> bytes:
    """The table key of one session of ``key``: its first and last record's times."""
    return orjson.dumps([key, [start_ms / 1000, end_ms / 1000]])


def table_key(window: AnyWindow, key: str, start_ms: int, end_ms: int | None = None) -> bytes:
    """The table key of a window of ``key`` (``end_ms``: a session's last record)."""
    if isinstance(window, Session):
        return session_key(key, start_ms, start_ms if end_ms is None else end_ms)
    return window_key(key, start_ms, window.size_ms / 1000)


def key_prefix(key: str) -> bytes:
    """The prefix every window key of ``key`` starts with."""
    return b"[" + orjson.dumps(key) + b","


def name_prefix(prefix: str) -> bytes:
    """The prefix of the window keys of every key that starts with ``prefix``."""
    return b"[" + orjson.dumps(prefix)[:-1]


def parse_window_key(raw: bytes) -> tuple[str, int] | None:
    """(key, window start in ms) of a window key, or None for another key."""
    found = parse_window_range(raw)
    return None if found is None else (found[0], found[1])


def parse_window_range(raw: bytes) -> tuple[str, int, float] | None:
    """(key, window start in ms, ``end_s`` as stored) of a window key, or None."""
    try:
        name, (start, end) = orjson.loads(raw)
    except (orjson.JSONDecodeError, TypeError, ValueError):
        return None
    if not isinstance(name, str) or not isinstance(start, int | float):
        return None
    if not isinstance(end, int | float):
        return None
    return name, round(float(start) * 1000), float(end)


def window_end_ms(window: AnyWindow, start_ms: int, end_s: float) -> int:
    """The end (exclusive, ms) of a stored window; a session holds its last record's time."""
    if isinstance(window, Session):
        return round(end_s * 1000) + 1
    return window.end(start_ms)


# -- expiry ---------------------------------------------------------------------------


class ScanView(Protocol):
    def scan(self, prefix: bytes) -> Iterator[tuple[bytes, Any]]: ...


@dataclass
class WindowIndex:
    """The windows of one table partition by their end, for expiry (built on first use
    from the partition, then kept up to date by what the batches write)."""

    window: AnyWindow
    keys: dict[int, set[bytes]] = field(default_factory=dict)
    ends: list[int] = field(default_factory=list)
    loaded: bool = False

    def load(self, table: ScanView) -> None:
        for key, _value in table.scan(b"["):
            found = parse_window_range(key)
            if found is not None:
                self.add(window_end_ms(self.window, found[1], found[2]), key)
        self.loaded = True

    def add(self, end: int, key: bytes) -> None:
        keys = self.keys.get(end)
        if keys is None:
            keys = self.keys[end] = set()
            heapq.heappush(self.ends, end)
        keys.add(key)

    def expire(self, horizon_ms: int) -> list[bytes]:
        """The keys of every window that ends at or before ``horizon_ms``, forgotten."""
        gone: list[bytes] = []
        while self.ends and self.ends[0] <= horizon_ms:
            gone.extend(self.keys.pop(heapq.heappop(self.ends), ()))
        return gone
