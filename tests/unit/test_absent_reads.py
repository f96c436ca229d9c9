"""A copy that is not the restored active copy never answers that a key is absent
(pure routing logic: the peers, the routing and the local copy are stand-ins)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import pytest

from api.errors import NoReplica, NotHeldHere
from api.local import LocalState
from api.peers import PeerAnswer
from api.positions import PositionWaits, ReadPosition
from api.queries import Consistency, KeyQuery, Queries
from api.routing import QueryTable
from tables.engine import TP
from tests.support.api import FixedMembership

TABLE = QueryTable(
    name="word_counts",
    kind="table",
    topic="streamstate-word_counts-changelog",
    partitions=4,
    standby_replicas=1,
    store=None,
)
PLAIN = KeyQuery(TABLE, "needle", b"needle", 1)


class Copy:
    """This worker's copy of partition 1: it holds only ``held``."""

    def __init__(self, replica: str, lag: int | None, held: dict[bytes, Any]) -> None:
        self.replica = replica
        self.offset_lag = lag
        self.held = held

    def stored_position(self) -> None:
        return None

    def get(self, raw: bytes) -> Any:
        return self.held.get(raw)


class Routing:
    own_url = "http://me"

    def __init__(self, owner: str | None) -> None:
        self.current = owner

    def owner(self, table: QueryTable, partition: int) -> str | None:
        return self.current

    def peers(self) -> list[str]:
        return ["http://me", "http://peer"]


class Local:
    def __init__(self, copy: Copy | None) -> None:
        self.held = copy

    def copy(self, table: QueryTable, partition: int) -> Copy | None:
        return self.held


class Peers:
    def __init__(self, answers: dict[str, PeerAnswer | None]) -> None:
        self.answers = answers

    async def get(self, base: str, path: str, params: dict[str, Any], **kw: Any) -> Any:
        return self.answers.get(base)

    def read_soon(self, base: str, table: str, key: str, **kw: Any) -> Any:
        answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        answer.set_result(self.answers.get(base))
        return answer


def queries(copy: Copy | None, owner: str | None, answers: dict[str, Any]) -> Queries:
    found = Queries.__new__(Queries)
    found.routing = Routing(owner)  # type: ignore[assignment]
    found.local = Local(copy)  # type: ignore[assignment]
    found.peers = Peers(answers)  # type: ignore[assignment]
    found.waits = PositionWaits()
    found.patience_s = 0.0
    position = ReadPosition(1, {"text-lines": {0: 7}}, 0, 0)
    found.position = lambda copy: position  # type: ignore[method-assign]
    return found


def read(reads: Queries, query: KeyQuery = PLAIN, forwarded_by: str | None = None) -> Any:
    return asyncio.run(reads.read(query, forwarded_by))


def test_a_restoring_owner_without_the_key_answers_503_not_404() -> None:
    restoring = Copy("standby", 120_000, {})
    reads = queries(restoring, "http://me", {"http://peer": None})
    with pytest.raises(NoReplica) as refused:
        read(reads)
    assert refused.value.status == 503
    assert refused.value.headers["Retry-After"] == "1"


def test_a_standby_that_says_it_is_caught_up_still_does_not_answer_absent() -> None:
    standby = Copy("standby", 0, {})
    reads = queries(standby, "http://owner", {"http://owner": None, "http://peer": None})
    with pytest.raises(NoReplica):
        read(reads)
    # asked directly (a forwarded read), it refuses as well: the forwarder asks elsewhere
    with pytest.raises(NoReplica) as refused:
        read(reads, forwarded_by="http://front")
    assert "may not have it yet" in refused.value.detail


def test_a_value_a_lagging_copy_holds_is_answered_with_its_lag() -> None:
    restoring = Copy("standby", 500, {b"needle": 3})
    answer = read(queries(restoring, "http://me", {"http://peer": None}))
    assert (answer.status, answer.body["value"], answer.body["offset_lag"]) == (200, 3, 500)
    assert answer.body["replica"] == "standby"


def test_the_active_copy_answers_absent() -> None:
    assert read(queries(Copy("active", 0, {}), "http://me", {})).status == 404
    owner_says = PeerAnswer("http://owner", 404, {"replica": "active", "offset_lag": 0})
    answer = read(queries(Copy("standby", 0, {}), "http://owner", {"http://owner": owner_says}))
    assert (answer.status, answer.body["replica"]) == (404, "active")


def test_a_standby_that_reached_the_reads_token_answers_absent() -> None:
    token = Consistency(token="t", topic="text-lines", wanted={0: 5}, timeout_ms=100)
    query = KeyQuery(TABLE, "needle", b"needle", 1, consistency=token)
    answer = read(queries(Copy("standby", 3, {}), "http://owner", {}), query, "http://front")
    assert answer.status == 404


class ClosedCopy(Copy):
    """A copy whose database a rebalance closed while the read waited."""

    def get(self, raw: bytes) -> Any:
        raise NotHeldHere("closed by a rebalance")


@pytest.mark.parametrize("replica", ["active", "standby"])
def test_a_copy_closed_by_a_rebalance_meanwhile_turns_the_read_to_another_copy(
    replica: str,
) -> None:
    peer_says = PeerAnswer("http://peer", 200, {"value": 4, "replica": "active", "offset_lag": 0})
    reads = queries(ClosedCopy(replica, 0, {}), "http://owner", {"http://peer": peer_says})
    answer = read(reads)
    assert (answer.status, answer.body["value"]) == (200, 4)


class Store:
    """A table store that holds partition 1's database until a rebalance closes it."""

    def __init__(self) -> None:
        self.open = {1}

    def held(self, partition: int) -> bool:
        return partition in self.open

    def partition(self, partition: int) -> Any:
        return {b"needle": b"3"}

    def position(self, partition: int) -> bytes | None:
        return None


def test_a_local_copy_is_one_whose_database_is_open_and_stops_being_one_when_it_closes() -> None:
    store = Store()
    table = replace(TABLE, store=store)  # type: ignore[arg-type]
    tp = TP(TABLE.topic, 1)
    local = LocalState(FixedMembership(actives=frozenset(), standbys=frozenset({tp})))
    copy = local.copy(table, 1)
    assert copy is not None
    assert copy.get(b"needle") == 3
    store.open.clear()  # a rebalance closes it while a read waits
    with pytest.raises(NotHeldHere):
        copy.get(b"needle")
    with pytest.raises(NotHeldHere):
        copy.stored_position()
    assert local.copy(table, 1) is None
