"""The tables of the pipelines, declared on a faust app.

Every table lives in RocksDB (rocksdict) with a compacted changelog topic
``streamstate-<table>-changelog`` and ``TABLE_STANDBY_REPLICAS`` standbys. Plain tables
use ``key_type=bytes`` so that their changelog keys are the raw UTF-8 bytes of the source
topics' keys: faust's router hashes changelog keys, and only equal bytes route a key to
the worker that holds it. Windowed tables cannot use raw keys; their changelog keys are
JSON ``[key, [start, end]]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal

import faust

from app.settings import Settings
from tables.restore import TrackedRecovery

TableKind = Literal["table", "windowed", "global"]

WORD_COUNTS = "word_counts"
INVENTORY = "inventory"
SALES_BY_CATEGORY = "sales_by_category"
UNSETTLED_SALES = "unsettled_sales"
PRODUCTS = "products"

#: sales_by_category windows, in seconds (faust windows count in seconds). The windows
#: follow event time: the sales repartition topic carries each sale's ``ts`` as its
#: record timestamp, and the table is relative to the stream.
SALES_WINDOW_S = 3600.0


@dataclass(frozen=True)
class TableInfo:
    """What the query layer needs to know about a table."""

    name: str
    kind: TableKind
    table: Any
    raw_keys: bool


@dataclass(frozen=True)
class Tables:
    """The tables of one app."""

    word_counts: Any
    inventory: Any
    sales_by_category: Any
    unsettled_sales: Any

    def infos(self) -> dict[str, TableInfo]:
        return {
            WORD_COUNTS: TableInfo(WORD_COUNTS, "table", self.word_counts, True),
            INVENTORY: TableInfo(INVENTORY, "table", self.inventory, True),
            SALES_BY_CATEGORY: TableInfo(
                SALES_BY_CATEGORY, "windowed", self.sales_by_category, False
            ),
            UNSETTLED_SALES: TableInfo(UNSETTLED_SALES, "table", self.unsettled_sales, True),
        }


def _counting(app: faust.App, name: str) -> Any:
    async def on_changelog_event(event: Any) -> None:
        recovery = getattr(app.tables, "recovery", None)
        if isinstance(recovery, TrackedRecovery):
            recovery.count(name, active=event.message.tp in recovery.active_tps)

    return on_changelog_event


def _options(app: faust.App, settings: Settings, name: str) -> dict[str, Any]:
    return {
        "partitions": settings.topic_partitions,
        "on_changelog_event": _counting(app, name),
        "help": name,
    }


def declare_tables(app: faust.App, settings: Settings) -> Tables:
    """Declare the pipelines' tables on ``app``."""
    word_counts = app.Table(
        WORD_COUNTS,
        key_type=bytes,
        value_type=int,
        default=int,
        **_options(app, settings, WORD_COUNTS),
    )
    inventory = app.Table(
        INVENTORY, key_type=bytes, default=None, **_options(app, settings, INVENTORY)
    )
    sales_table: Any = app.Table(
        SALES_BY_CATEGORY, default=dict, **_options(app, settings, SALES_BY_CATEGORY)
    )
    sales = sales_table.tumbling(
        timedelta(seconds=SALES_WINDOW_S),
        expires=timedelta(days=settings.window_retention_days),
    ).relative_to_stream()
    unsettled = app.Table(
        UNSETTLED_SALES,
        key_type=bytes,
        value_type=int,
        default=int,
        **_options(app, settings, UNSETTLED_SALES),
    )
    return Tables(word_counts, inventory, sales, unsettled)
