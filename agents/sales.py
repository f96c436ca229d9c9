"""sales_by_category: tumbling 1-hour windows on event time, per category.

``sales.count`` reads the sales repartition topic, where each record holds the sums of
one batch's sales of one (category, hour), and adds them into their windows: each
window a batch touches is read once and written once, under the key faust's windowed
table uses (``[category, [start_s, end_s]]``, ``end_s = start_s + 3600 - 0.1``).

Windows are kept ``STREAMSTATE_WINDOW_RETENTION_DAYS`` (wall-clock time, as the nightly
job assumes): a window that ends before that horizon is deleted in the next batch of its
partition, and sums for such a window are not written again.
"""

from __future__ import annotations

import functools
import heapq
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from agents.inventory import SALES_REPARTITION_TOPIC
from core.semantics import HOUR_MS, add_sale, window_start
from tables.definitions import SALES_BY_CATEGORY
from tables.pipeline import Batch, Context, Pipeline, TableSpec, TableView
from tables.windows import parse_window_key, window_key


def sums_of(value: Any, timestamp: int) -> tuple[int, int, float]:
    """(window start, units, revenue) of a repartition record: a batch's sums, or one sale
    in the per-sale format of earlier versions (``{"units", "revenue", "ts"}``)."""
    if not isinstance(value, dict):
        raise ValueError(f"a sales record is a JSON object, not {type(value).__name__}")
    start = value.get("window_start")
    if start is None:
        start = window_start(int(value.get("ts", timestamp)))
    if int(start) % HOUR_MS:
        raise ValueError(f"window_start {start} is not the start of an hour")
    return int(start), int(value["units"]), float(value["revenue"])


@dataclass
class Windows:
    """The windows of one table partition by start, for expiry (built on first use)."""

    keys: dict[int, set[bytes]] = field(default_factory=dict)
    starts: list[int] = field(default_factory=list)
    loaded: bool = False

    def load(self, table: TableView) -> None:
        for key, _value in table.scan(b"["):
            parsed = parse_window_key(key)
            if parsed is not None:
                self.add(parsed[1], key)
        self.loaded = True

    def add(self, start: int, key: bytes) -> None:
        keys = self.keys.get(start)
        if keys is None:
            keys = self.keys[start] = set()
            heapq.heappush(self.starts, start)
        keys.add(key)

    def expire(self, horizon_ms: int) -> list[bytes]:
        """The keys of every window that ends at or before ``horizon_ms``, forgotten."""
        gone: list[bytes] = []
        while self.starts and self.starts[0] + HOUR_MS <= horizon_ms:
            gone.extend(self.keys.pop(heapq.heappop(self.starts), ()))
        return gone


def count_sales(batch: Batch, *, retention_ms: int, now: Callable[[], float] = time.time) -> None:
    """One partition's sales sums -> the new totals of the windows they fall in."""
    table = batch.table(SALES_BY_CATEGORY)
    windows: Windows = batch.cache
    if not windows.loaded:
        windows.load(table)
    horizon = int(now() * 1000) - retention_ms
    totals: dict[bytes, Any] = {}
    for record in batch.of(SALES_REPARTITION_TOPIC):
        if record.key is None:
            raise ValueError("a sales record without a category key")
        start, units, revenue = sums_of(orjson.loads(record.value or b"null"), record.timestamp)
        if start + HOUR_MS <= horizon:
            continue  # the window has expired
        key = window_key(record.key.decode("utf-8"), start)
        if key not in totals:
            totals[key] = table.get(key)
            windows.add(start, key)
        totals[key] = add_sale(totals[key], units, revenue)
    for key, value in totals.items():
        table.put(key, value)
    for key in windows.expire(horizon):
        table.delete(key)


def pipelines(context: Context) -> list[Pipeline]:
    return [
        Pipeline(
            name="sales.count",
            reads=(SALES_REPARTITION_TOPIC,),
            writes=(TableSpec(SALES_BY_CATEGORY, ordered=True, queryable=True),),
            process=functools.partial(count_sales, retention_ms=context.window_retention_ms),
            cache=Windows,
        )
    ]
