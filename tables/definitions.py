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

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal

import faust

from core.settings import Settings
from tables.faust_adapter import FaustTableStore, restore_counter
from tables.pipeline import TableSpec
from tables.windows import SALES_WINDOW_S

TableKind = Literal["table", "windowed", "global"]

WORD_COUNTS = "word_counts"
INVENTORY = "inventory"
SALES_BY_CATEGORY = "sales_by_category"
UNSETTLED_SALES = "unsettled_sales"
PRODUCTS = "products"


#: The tables of the contract (``/tables``), each with its kind.
CONTRACT_TABLES: dict[str, TableKind] = {
    WORD_COUNTS: "table",
    INVENTORY: "table",
    SALES_BY_CATEGORY: "windowed",
    UNSETTLED_SALES: "table",
}


@dataclass(frozen=True)
class TableInfo:
    """What the query layer needs to know about a table."""

    name: str
    kind: TableKind
    #: the faust table (for a windowed table, the underlying one, with its window)
    table: Any
    #: window length in ms (windowed tables)
    window_ms: int | None = None


@dataclass(frozen=True)
class Tables:
    """The tables of one app: the queryable ones and the pipelines' internal state."""

    #: every table by name, as faust declared it
    declared: dict[str, Any]
    #: the tables the HTTP API serves, by name
    queryable: dict[str, TableInfo]

    def stores(self) -> dict[str, FaustTableStore]:
        """The engine's view of every table."""
        return {name: FaustTableStore(table) for name, table in self.declared.items()}

    def infos(self) -> dict[str, TableInfo]:
        return dict(self.queryable)


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
        "options": {"write_buffer_size": settings.rocksdb_write_buffer_mb * 1024 * 1024},
    }


def _declare(app: faust.App, settings: Settings, spec: TableSpec) -> Any:
    config = dict(spec.changelog_config)
    table: Any = app.Table(
        spec.name, extra_topic_configs=config or None, **_options(app, settings, spec.name)
    )
    if CONTRACT_TABLES.get(spec.name) == "windowed":
        # Declared windowed for its changelog's retention (compact,delete, the windows'
        # retention); the engine writes its window keys itself (tables/windows.py).
        table = table.tumbling(
            timedelta(seconds=SALES_WINDOW_S),
            expires=timedelta(days=settings.window_retention_days),
        ).table
    return table


def declare_tables(app: faust.App, settings: Settings, specs: Iterable[TableSpec]) -> Tables:
    """Declare on ``app`` every table the pipelines write (``specs``, by name: the first
    spec of a name declares it; any spec marks it queryable)."""
    declared: dict[str, Any] = {}
    queryable: dict[str, TableInfo] = {}
    for spec in specs:
        if spec.name not in declared:
            declared[spec.name] = _declare(app, settings, spec)
        if spec.queryable or spec.name in CONTRACT_TABLES:
            table = declared[spec.name]
            kind = CONTRACT_TABLES.get(spec.name, "table")
            window_ms = round(table.window.size * 1000) if kind == "windowed" else None
            queryable[spec.name] = TableInfo(spec.name, kind, table, window_ms)
    return Tables(declared, queryable)
