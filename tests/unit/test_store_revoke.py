"""The tables' RocksDB store at a rebalance: the databases it drops are parked, not
closed, until the recovery closes them (real RocksDB files)."""

from __future__ import annotations

import asyncio
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
    assert store.take_parked() == []


def test_a_dropped_database_is_parked_and_handed_back_if_its_partition_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    table, store = word_counts(monkeypatch, tmp_path)
    topic = table.changelog_topic.get_topic_name()
    handle = FaustTableStore(table).partition(3).db
    handle[b"kept"] = b"1"
    calls = collections(monkeypatch)
    store.revoke_partitions(table, {TP(topic, 3), TP(topic, 5)})
    assert calls == []  # nothing collected or closed within the rebalance
    assert 3 not in store._dbs
    assert not FaustTableStore(table).held(3)
    again = FaustTableStore(table).partition(3).db
    assert again is handle
    assert again[b"kept"] == b"1"
    assert store.take_parked() == []


def test_the_recovery_closes_parked_databases_and_their_partitions_open_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    table, store = word_counts(monkeypatch, tmp_path)
    topic = table.changelog_topic.get_topic_name()
    handle = FaustTableStore(table).partition(3).db
    handle[b"kept"] = b"1"
    store.revoke_partitions(table, {TP(topic, 3)})
    asyncio.run(table.app.tables.recovery._close_parked())
    assert store.take_parked() == []
    with pytest.raises(Exception, match=r"(?i)closed"):
        handle[b"kept"]
    # Its lock released: the partition opens again at once, a new handle on the same files.
    again = FaustTableStore(table).partition(3).db
    assert again is not handle
    assert again[b"kept"] == b"1"


def test_a_stopping_store_releases_its_databases_without_collecting_garbage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    table, store = word_counts(monkeypatch, tmp_path)
    topic = table.changelog_topic.get_topic_name()
    FaustTableStore(table).partition(3).db[b"kept"] = b"1"
    FaustTableStore(table).partition(5)
    store.revoke_partitions(table, {TP(topic, 5)})  # parked
    calls = collections(monkeypatch)
    asyncio.run(store.stop())
    assert calls == []
    assert store._dbs == {}
    assert store.take_parked() == []
    # Closed as their last reference went: their locks are free.
    assert FaustTableStore(table).partition(3).db[b"kept"] == b"1"
    FaustTableStore(table).partition(5)


def test_a_table_partition_opens_with_bloom_filters_on_its_files_and_memtables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A whole-key filter over the memtables (RocksDB records it in the database's OPTIONS
    file), and 10 bits a key in the table files' filters (measured on a flushed file)."""
    table, store = word_counts(monkeypatch, tmp_path)
    FaustTableStore(table).partition(2)
    [options] = sorted(store.partition_path(2).glob("OPTIONS-*"))
    text = options.read_text()
    assert "memtable_whole_key_filtering=true" in text
    assert "memtable_prefix_bloom_size_ratio=0.100000" in text
    db = store._dbs[2]
    for n in range(20_000):
        db.put(f"word-{n}".encode(), b"1")
    db.flush()
    found = dict(
        part.strip().split("=", 1)
        for part in db.property_value("rocksdb.aggregated-table-properties").split(";")
        if "=" in part
    )
    bits = 8 * int(found["filter block size"]) / int(found["# entries for filter"])
    assert 9.5 <= bits <= 11, found  # faust's default of 3 bits makes about 3
