"""The keys of a windowed table: ``[key, [start_s, end_s]]`` as JSON, byte for byte as
faust's windowed tables write them (``end_s = start_s + size - 0.1``).

The engine writes these keys (``agents/sales.py``) and the query layer seeks them
(``api/local.py``); both take them from here.
"""

from __future__ import annotations

import orjson

#: Window length of sales_by_category, in seconds (faust windows count in seconds).
SALES_WINDOW_S = 3600.0


def window_range(start_ms: int, size_s: float = SALES_WINDOW_S) -> tuple[float, float]:
    """The range faust keys a tumbling window by (``end = start + size - 0.1``)."""
    start = float(start_ms // 1000)
    return (start, start + size_s - 0.1)


def window_key(key: str, start_ms: int, size_s: float = SALES_WINDOW_S) -> bytes:
    """The table key of one window of ``key``."""
    return orjson.dumps([key, list(window_range(start_ms, size_s))])


def key_prefix(key: str) -> bytes:
    """The prefix every window key of ``key`` starts with."""
    return b"[" + orjson.dumps(key) + b","


def name_prefix(prefix: str) -> bytes:
    """The prefix of the window keys of every key that starts with ``prefix``."""
    return b"[" + orjson.dumps(prefix)[:-1]


def parse_window_key(raw: bytes) -> tuple[str, int] | None:
    """(key, window start in ms) of a window key, or None for another key."""
    try:
        name, (start, _end) = orjson.loads(raw)
    except (orjson.JSONDecodeError, TypeError, ValueError):
        return None
    if not isinstance(name, str) or not isinstance(start, int | float):
        return None
    return name, round(float(start) * 1000)
