"""Key reads of a global table carry the position of this worker's copy (its offsets in
the table's topic), wait for a write's token, and honour staleness bounds; the copy
records what it applied and tells its listeners (the copy, the routing and the input
ends are stand-ins, but for the copy's own RocksDB database on a temporary path)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from rocksdict import Options, Rdict

from api.errors import BadRequest, NoReplica, NotYet
from api.positions import Positions, PositionWaits
from api.queries import Queries, ReadOptions
from api.routing import QueryTable
from api.tokens import Token, encode_token
from core.values import Json
from tables.global_table import GlobalSpec, GlobalTableService
from tables.positions import Lineage

APP_ID = "app"
#: partition_for(b"sku-1", 4) and of b"sku-10"
PARTITION = 3


class Copy:
    """This worker's copy of the global table: ``applied`` per partition of its topic."""

    def __init__(self, applied: int, values: dict[str, Any], lag: int | None = 0) -> None:
        self.spec = SimpleNamespace(topic="products")
        self.offsets = {PARTITION: applied}
        self.values = values
        self.lag = lag

    def applied(self, partition: int) -> int:
        return self.offsets.get(partition, 0)

    def partition_lag(self, partition: int) -> int | None:
        return self.lag

    def document(self, key: str) -> Any | None:
        return self.values.get(key)


class Ends:
    """The end offsets of the topics, as the background refresh knows them."""

    def __init__(self, end: int | None) -> None:
        self.ends = {("products", PARTITION): end}

    def end(self, topic: str, partition: int) -> int | None:
        return self.ends.get((topic, partition))

    def age_ms(self, topic: str, partition: int, offset: int, now: float) -> int:
        end = self.ends.get((topic, partition))
        return 1500 if end is not None and end > offset else 0


def table(copy: Copy) -> QueryTable:
    return QueryTable("products", "global", "products", 4, 0, copy=copy)  # type: ignore[arg-type]


def queries(copy: Copy, end: int | None) -> Queries:
    found = Queries.__new__(Queries)
    found.routing = SimpleNamespace(own_url="http://me")  # type: ignore[assignment]
    lineage = Lineage(frozenset(), {"inventory": frozenset({"item-events"})}, {})
    sources = ["item-events", "products"]
    found.positions = Positions(lineage, 4, sources, Ends(end))  # type: ignore[arg-type]
    found.waits = PositionWaits()
    found.app_id = APP_ID
    found._consistencies = {}
    found._tables = {"products": table(copy)}
    return found


def token(offsets: dict[int, int], topic: str = "products") -> str:
    return encode_token(Token(topic, offsets), APP_ID)


def test_a_plain_read_of_a_global_table_carries_the_position_of_this_workers_copy() -> None:
    copy = Copy(7, {"sku-1": {"sku": "sku-1"}})
    reads = queries(copy, end=7)
    answer = reads.read_now(reads.query(table(copy), "sku-1", None, None, None), None)
    assert answer is not None
    assert (answer.status, answer.body["replica"]) == (200, "global")
    position = {"partition": PARTITION, "applied": {"products": {"3": 7}}}
    assert answer.body["position"] == {**position, "lag_records": 0, "lag_ms": 0}
    # behind the topic's end: the lag and the age of the oldest record not applied
    reads = queries(copy, end=9)
    answer = reads.read_now(reads.query(table(copy), "sku-1", None, None, None), None)
    assert answer is not None
    assert answer.body["position"] == {**position, "lag_records": 2, "lag_ms": 1500}
    # an absent key, while the copy is behind: 503, with the position
    copy.lag = 2
    with pytest.raises(NoReplica) as refused:
        reads.read_now(reads.query(table(copy), "sku-10", None, None, None), None)
    assert refused.value.body()["position"]["applied"] == {"products": {"3": 7}}


def test_a_token_read_of_a_global_table_waits_for_the_copy_to_reach_the_write() -> None:
    copy = Copy(7, {"sku-1": {"sku": "sku-1", "name": "old"}})
    reads = queries(copy, end=8)
    # the write went to the key's partition (offset 7) and to another one
    options = ReadOptions(consistent_with=token({PARTITION: 8, 0: 40}), timeout_ms=2_000)
    query = reads.query(table(copy), "sku-1", None, None, None, options)
    assert query.consistency.wanted == {PARTITION: 8}  # only the key's partition counts
    assert reads.read_now(query, None) is None  # not there yet: read() waits

    async def run() -> Any:
        async def apply() -> None:
            await asyncio.sleep(0.2)
            copy.offsets[PARTITION] = 8
            copy.values["sku-1"] = {"sku": "sku-1", "name": "new"}
            reads.waits.notify()  # what the copy's listener does

        started = time.monotonic()
        applying = asyncio.create_task(apply())
        answer = await reads.read(query, None)
        await applying
        return answer, time.monotonic() - started

    answer, took = asyncio.run(run())
    assert (answer.status, answer.body["value"]["name"]) == (200, "new")
    assert answer.body["position"]["applied"] == {"products": {"3": 8}}
    assert took < 1.0
    assert reads.read_now(query, None) is not None  # now at once


def test_a_token_the_global_copy_does_not_reach_in_time_is_a_504_with_its_position() -> None:
    copy = Copy(7, {"sku-1": {"sku": "sku-1"}})
    reads = queries(copy, end=7)
    options = ReadOptions(consistent_with=token({PARTITION: 50}), timeout_ms=200)
    query = reads.query(table(copy), "sku-1", None, None, None, options)
    with pytest.raises(NotYet) as waited:
        asyncio.run(reads.read(query, None))
    body = waited.value.body()
    assert body["position"]["applied"] == {"products": {"3": 7}}
    assert body["waiting_for"] == {"products": {"3": 50}}
    assert reads.waits.timeouts == 1


def test_a_global_copy_that_reached_the_token_answers_that_a_key_is_absent() -> None:
    copy = Copy(8, {}, lag=3)  # behind other records, but past the write
    reads = queries(copy, end=11)
    options = ReadOptions(consistent_with=token({PARTITION: 8}))
    answer = reads.read_now(reads.query(table(copy), "sku-1", None, None, None, options), None)
    assert answer is not None
    assert answer.status == 404
    assert answer.body["position"]["applied"] == {"products": {"3": 8}}


def test_a_token_of_a_topic_that_does_not_feed_the_global_table_is_refused() -> None:
    copy = Copy(7, {})
    reads = queries(copy, end=7)
    other = ReadOptions(consistent_with=token({PARTITION: 1}, topic="item-events"))
    with pytest.raises(BadRequest, match="item-events, which does not feed products"):
        reads.query(table(copy), "sku-1", None, None, None, other)


def test_a_global_copy_beyond_the_staleness_bound_is_refused_with_its_position() -> None:
    copy = Copy(7, {"sku-1": {"sku": "sku-1"}}, lag=1)
    reads = queries(copy, end=8)
    bounded = ReadOptions(max_lag_records=0)
    with pytest.raises(NoReplica, match="lag_records 1 exceeds max_lag_records 0") as refused:
        reads.read_now(reads.query(table(copy), "sku-1", None, None, None, bounded), None)
    assert refused.value.body()["position"]["lag_records"] == 1
    assert refused.value.headers["Retry-After"]
    within = ReadOptions(max_lag_records=1, max_lag_ms=2_000)
    answer = reads.read_now(reads.query(table(copy), "sku-1", None, None, None, within), None)
    assert answer is not None
    assert answer.status == 200
    # the topic's end not known yet: no bound holds
    reads = queries(copy, end=None)
    with pytest.raises(NoReplica, match="lag_records None"):
        reads.read_now(reads.query(table(copy), "sku-1", None, None, None, within), None)


def record(offset: int, sku: str) -> Any:
    value = f'{{"sku": "{sku}"}}'.encode()
    return SimpleNamespace(key=sku.encode(), value=value, timestamp=1_000, offset=offset)


def test_the_global_copy_keeps_its_applied_offsets_and_tells_its_listeners(
    tmp_path: Path,
) -> None:
    spec = GlobalSpec("products", "products", Json, key="sku")
    service = GlobalTableService(spec, bootstrap="127.0.0.1:1", path=tmp_path / "g", max_bytes=1)
    assert service.applied(2) == 0  # not started: holds nothing
    service._db = Rdict(str(tmp_path / "g"), options=Options(raw_mode=True))
    told: list[int] = []
    service.listeners.append(told.append)
    service.max_bytes = 1 << 20
    service._apply(2, [record(4, "sku-a"), record(5, "sku-b")])
    assert (service.applied(2), service.applied(1), told) == (6, 0, [2])
    service._apply(1, [])  # nothing fetched: nothing to tell
    assert told == [2]
    service._db.close()
    # a restarted copy reads its offsets from the database
    again = GlobalTableService(spec, bootstrap="127.0.0.1:1", path=tmp_path / "g", max_bytes=1)
    again._db = Rdict(str(tmp_path / "g"), options=Options(raw_mode=True))
    assert again.applied(2) == 6
    again._db.close()
