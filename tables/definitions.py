"""The tables of the pipelines, declared on a faust app.

Every table lives in RocksDB (rocksdict) with a compacted changelog topic
``<app id>-<table>-changelog`` and ``TABLE_STANDBY_REPLICAS`` standbys. The engine
writes every table (``tables/engine.py``); faust restores them and keeps the standbys.
Keys and values are the changelog's bytes as the engine writes them: raw UTF-8 keys, so a
key's changelog partition is the murmur2 partition of its records, and JSON values. A
windowed table's keys are :mod:`tables.windows`' window keys; its changelog also
deletes what is older than the windows' retention.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import faust

from core.settings import Settings
from tables.faust_adapter import FaustTableStore, restore_counter
from tables.pipeline import TableKind, TableSpec

#: Bloom filter bits per key in every table's RocksDB files.
BLOOM_BITS_PER_KEY = 10


@dataclass(frozen=True)
class TableInfo:
    """What the query layer needs to know about a table."""

    name: str
    kind: TableKind
    #: the faust table
    table: Any
    #: the table's declaration (its window, for a windowed table)
    spec: TableSpec


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


def _declare(app: faust.App, settings: Settings, spec: TableSpec) -> Any:
    config = dict(spec.changelog_config)
    # Keys and values are the changelog's bytes as the engine writes them: faust's
    # recovery and standbys copy them into RocksDB without decoding, so no record the
    # engine writes can fail to restore.
    return app.Table(
        spec.name,
        key_type=bytes,
        value_type=bytes,
        default=None,
        partitions=settings.topic_partitions,
        on_changelog_event=restore_counter(app, spec.name),
        help=spec.name,
        extra_topic_configs=config or None,
        options={
            "write_buffer_size": settings.rocksdb_write_buffer_mb * 1024 * 1024,
            # 10 bits a key: about 1% of the lookups of absent keys read a block (faust's
            # default of 3 bits lets about a sixth of them through).
            "bloom_filter_size": BLOOM_BITS_PER_KEY,
        },
    )


def declare_tables(app: faust.App, settings: Settings, specs: Iterable[TableSpec]) -> Tables:
    """Declare on ``app`` every table the pipelines write (``specs``, by name: the first
    spec of a name declares it; any spec marks it queryable)."""
    declared: dict[str, Any] = {}
    queryable: dict[str, TableInfo] = {}
    for spec in specs:
        if spec.name not in declared:
            declared[spec.name] = _declare(app, settings, spec)
        if spec.queryable:
            queryable[spec.name] = TableInfo(spec.name, spec.kind, declared[spec.name], spec)
    return Tables(declared, queryable)
