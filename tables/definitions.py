"""The tables of the pipelines, declared on a faust app.

Every table lives in RocksDB (rocksdict) with a compacted changelog topic
``streamstate-<table>-changelog`` and ``TABLE_STANDBY_REPLICAS`` standbys. The engine
writes every table (``tables/engine.py``); faust restores them and keeps the standbys.
Plain tables are keyed by the raw UTF-8 bytes of the source topics' keys, so a key's
changelog partition is the murmur2 partition of its source records. The windowed table's
keys are JSON ``[key, [start, end]]`` (``tables/windows.py``); its records are
partitioned by the raw key.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal

import faust

from app.settings import Settings
from tables.faust_adapter import FaustTableStore, restore_counter
from tables.windows import SALES_WINDOW_S

TableKind = Literal["table", "windowed", "global"]

WORD_COUNTS = "word_counts"
INVENTORY = "inventory"
SALES_BY_CATEGORY = "sales_by_category"
UNSETTLED_SALES = "unsettled_sales"
PRODUCTS = "products"


@dataclass(frozen=True)
class TableInfo:
    """What the query layer needs to know about a table."""

    name: str
    kind: TableKind
    table: Any
    raw_keys: bool


@dataclass(frozen=True)
class Tables:
    """The tables of one app: the queryable ones, and the internal state of pipelines."""

    word_counts: Any
    inventory: Any
    sales_by_category: Any
    unsettled_sales: Any
    #: the pipelines' own tables (the settling join's buffers), by name
    internal: dict[str, Any]

    def all(self) -> dict[str, Any]:
        """Every table by name (a windowed table as its underlying table)."""
        return {
            WORD_COUNTS: self.word_counts,
            INVENTORY: self.inventory,
            SALES_BY_CATEGORY: self.sales_by_category.table,
            UNSETTLED_SALES: self.unsettled_sales,
            **self.internal,
        }

    def stores(self) -> dict[str, FaustTableStore]:
        """The engine's view of every table."""
        return {name: FaustTableStore(table) for name, table in self.all().items()}

    def infos(self) -> dict[str, TableInfo]:
        return {
            WORD_COUNTS: TableInfo(WORD_COUNTS, "table", self.word_counts, True),
            INVENTORY: TableInfo(INVENTORY, "table", self.inventory, True),
            SALES_BY_CATEGORY: TableInfo(
                SALES_BY_CATEGORY, "windowed", self.sales_by_category, False
            ),
            UNSETTLED_SALES: TableInfo(UNSETTLED_SALES, "table", self.unsettled_sales, True),
        }


def _options(app: faust.App, settings: Settings, name: str) -> dict[str, Any]:
    # Keys and values are the changelog's bytes as the engine writes them (JSON values,
    # raw or JSON keys): faust's recovery and standbys copy them into RocksDB without
    # decoding, so no record the engine writes can fail to restore.
    return {
        "key_type": bytes,
        "value_type": bytes,
        "default": None,
        "partitions": settings.topic_partitions,
        "on_changelog_event": restore_counter(app, name),
        "help": name,
    }


def declare_tables(app: faust.App, settings: Settings, internal: tuple[str, ...] = ()) -> Tables:
    """Declare the pipelines' tables on ``app``; ``internal``: the names of the
    pipelines' own tables (raw keys, JSON values, not queryable)."""
    word_counts = app.Table(WORD_COUNTS, **_options(app, settings, WORD_COUNTS))
    inventory = app.Table(INVENTORY, **_options(app, settings, INVENTORY))
    sales_table: Any = app.Table(SALES_BY_CATEGORY, **_options(app, settings, SALES_BY_CATEGORY))
    # Declared windowed for its changelog's retention (compact,delete, the windows'
    # retention); the engine writes its window keys itself (tables/windows.py).
    sales = sales_table.tumbling(
        timedelta(seconds=SALES_WINDOW_S),
        expires=timedelta(days=settings.window_retention_days),
    ).relative_to_stream()
    unsettled = app.Table(UNSETTLED_SALES, **_options(app, settings, UNSETTLED_SALES))
    own = {
        name: app.Table(
            name,
            # Expired records leave tombstones; rolling segments every 10 minutes lets
            # the broker compact them away instead of keeping a week of history.
            extra_topic_configs={"segment.ms": str(10 * 60 * 1000)},
            **_options(app, settings, name),
        )
        for name in internal
    }
    return Tables(word_counts, inventory, sales, unsettled, own)
