"""The tables' RocksDB store at a rebalance: a full garbage collection only when it
drops a partition database (real RocksDB files)."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
from faust.types import TP

from tables.faust_adapter import EngineStore, EngineTable, FaustTableStore


def word_counts(monkeypatch: pytest.MonkeyPatch, datadir: Path) -> tuple[EngineTable, EngineStore]:
    """The app's word_counts table, a real faust table on RocksDB files in ``datadir``, and
    its store."""
    from app.main import create_app
    from core.settings import Settings

    monkeypatch.setenv("APP_DATADIR", str(datadir))
    table = create_app(Settings()).tables["word_counts"]
    assert isinstance(table, EngineTable)
    assert isinstance(table.data, EngineStore)
    return table, table.data


def collections(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts each gc.collect() from now on (and still collects)."""
    calls: list[int] = []
    collect = gc.collect

    def counted(*args: int) -> int:
        calls.append(1)
        return collect(*args)

    monkeypatch.setattr(gc, "collect", counted)
    return calls


def test_a_rebalance_that_drops_no_database_collects_no_garbage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    table, store = word_counts(monkeypatch, tmp_path)
    topic = table.changelog_topic.get_topic_name()
    FaustTableStore(table).partition(3)
    calls = collections(monkeypatch)
    # Nothing revoked, a partition never opened here, another table's partition 3.
    store.revoke_partitions(table, set())
    store.revoke_partitions(table, {TP(topic, 5)})
    store.revoke_partitions(table, {TP("streamstate-inventory-changelog", 3)})
    assert calls == []
    assert 3 in store._dbs


def test_a_dropped_database_is_collected_and_its_partition_opens_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    table, store = word_counts(monkeypatch, tmp_path)
    topic = table.changelog_topic.get_topic_name()
    FaustTableStore(table).partition(3).db[b"kept"] = b"1"
    calls = collections(monkeypatch)
    store.revoke_partitions(table, {TP(topic, 3), TP(topic, 5)})
    assert calls == [1]
    assert 3 not in store._dbs
    # The dropped handle is gone with its lock: the partition opens again at once.
    assert FaustTableStore(table).partition(3).db[b"kept"] == b"1"
