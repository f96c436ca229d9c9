"""A read that waits for a token's position keeps one deadline over every hop, and a
standby that waits stops when its partition moves to another owner (pure routing logic:
the peers, the routing and the local copy are stand-ins)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from api.errors import BadRequest, NoReplica, NotYet
from api.peers import PeerAnswer
from api.positions import PositionWaits, ReadPosition
from api.queries import (
    ANSWER_GRACE_S,
    DEFAULT_WAIT_MS,
    Consistency,
    KeyQuery,
    Queries,
    ReadOptions,
)
from api.routing import QueryTable
from api.tokens import Token, encode_token

TABLE = QueryTable(
    name="inventory",
    kind="table",
    topic="streamstate-inventory-changelog",
    partitions=4,
    standby_replicas=1,
    store=None,
)
QUERY = KeyQuery(
    TABLE,
    "store-1",
    b"store-1",
    2,
    consistency=Consistency(token="t", topic="item-events", wanted={2: 10}, timeout_ms=2_000),
)


class Standby:
    """This worker's standby copy: stuck before the token's position."""

    replica = "standby"
    offset_lag = 5

    def stored_position(self) -> None:
        return None

    def get(self, raw: bytes) -> Any:
        return {"old": True}


class Routing:
    own_url = "http://me"

    def __init__(self, owner: str) -> None:
        self.current = owner

    def owner(self, table: QueryTable, partition: int) -> str:
        return self.current

    def peers(self) -> list[str]:
        return ["http://me", "http://dead", "http://new"]


class Local:
    def __init__(self, copy: Any) -> None:
        self.held = copy

    def copy(self, table: QueryTable, partition: int) -> Any:
        return self.held


class Peers:
    """The dead owner does not answer; the new owner answers as the active copy."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, int | None, float]] = []
        self.graces: list[float | None] = []

    async def get(
        self,
        base: str,
        path: str,
        params: dict[str, Any],
        *,
        purpose: str,
        wait: float = 0.0,
        grace: float | None = None,
    ) -> PeerAnswer | None:
        self.asked.append((base, params.get("timeout_ms"), wait))
        self.graces.append(grace)
        return self.answer(base)

    def answer(self, base: str) -> PeerAnswer | None:
        if base == "http://new":
            body = {"replica": "active", "offset_lag": 0, "value": {"new": True}}
            return PeerAnswer(base, 200, body)
        return None

    def read_soon(self, base: str, table: str, key: str, *, purpose: str) -> Any:
        return asyncio.ensure_future(self.get(base, "", {}, purpose=purpose))


def queries(routing: Routing, local: Local, peers: Peers) -> Queries:
    found = Queries.__new__(Queries)
    found.routing = routing  # type: ignore[assignment]
    found.local = local  # type: ignore[assignment]
    found.peers = peers  # type: ignore[assignment]
    found.waits = PositionWaits()
    found.position = lambda copy: STANDBY_POSITION  # type: ignore[method-assign]
    return found


#: where this worker's standby copy is: 5 records behind, 3 records into item-events 2
STANDBY_POSITION = ReadPosition(2, {"item-events": {2: 3}}, 5, None)


def test_a_waiting_standby_gives_way_to_the_new_owner_within_the_timeout() -> None:
    routing, peers = Routing("http://dead"), Peers()
    reads = queries(routing, Local(Standby()), peers)

    async def run() -> Any:
        async def hand_over() -> None:
            await asyncio.sleep(0.3)
            routing.current = "http://new"

        mover = asyncio.create_task(hand_over())
        answer = await reads.read(QUERY, forwarded_by=None)
        await mover
        return answer

    answer = asyncio.run(run())
    assert answer.status == 200
    assert answer.body["value"] == {"new": True}
    # asked: the dead owner first, then the new one, with what was left of 2,000 ms
    assert [base for base, _, _ in peers.asked] == ["http://dead", "http://new"]
    first, second = peers.asked[0][1], peers.asked[1][1]
    assert first is not None
    assert second is not None
    assert second < first <= 2_000
    # handed on after the standby's wait of at least 300 ms, not after its whole timeout
    assert second <= 2_000 - 300


def test_no_copy_reaching_the_position_ends_the_read_at_its_timeout() -> None:
    routing, peers_without_new = Routing("http://dead"), Peers()

    async def nobody(base: str, path: str, params: dict[str, Any], **kw: Any) -> None:
        peers_without_new.asked.append((base, params.get("timeout_ms"), kw["wait"]))

    peers_without_new.get = nobody  # type: ignore[method-assign,assignment]
    quick = KeyQuery(
        TABLE,
        "store-1",
        b"store-1",
        2,
        consistency=Consistency(token="t", topic="item-events", wanted={2: 10}, timeout_ms=400),
    )
    reads = queries(routing, Local(Standby()), peers_without_new)
    reads.patience_s = 0.0  # no asking again (see the next test)
    # a 504 with the position of this worker's standby, which answered "not yet"
    with pytest.raises(NotYet) as waited:
        asyncio.run(reads.read(quick, forwarded_by=None))
    assert waited.value.body()["position"] == STANDBY_POSITION.as_dict()
    assert waited.value.body()["waiting_for"] == {"item-events": {"2": 10}}
    # every ask after the standby's wait had no time left to hand on
    later = peers_without_new.asked[1:]
    assert later
    assert all(timeout == 0 and wait == 0 for _, timeout, wait in later)
    assert reads.waits.timeouts == 1  # one read answered 504, counted once


def test_only_a_read_answered_504_counts_as_a_position_wait_timeout() -> None:
    # The owner is gone; this worker's standby waits the whole timeout in vain; another
    # worker's copy holds the position: the read is answered 200, and no timeout counts.
    routing, peers = Routing("http://dead"), Peers()
    quick = KeyQuery(
        TABLE,
        "store-1",
        b"store-1",
        2,
        consistency=Consistency(token="t", topic="item-events", wanted={2: 10}, timeout_ms=200),
    )
    reads = queries(routing, Local(Standby()), peers)
    answer = asyncio.run(reads.read(quick, forwarded_by=None))
    assert (answer.status, answer.body["value"]) == (200, {"new": True})
    assert reads.waits.timeouts == 0
    # every peer was asked to answer within the read's timeout and a short grace, not the
    # forwarding timeout as well
    assert set(peers.graces) == {ANSWER_GRACE_S}
    # A peer's forwarded read that times out is counted by the worker that answers the
    # client, not here.
    forwarded = queries(routing, Local(Standby()), Peers())
    with pytest.raises(NotYet):
        asyncio.run(forwarded.read(quick, forwarded_by="http://other"))
    assert forwarded.waits.timeouts == 0


def test_a_standby_holding_the_tokens_position_waits_for_the_owner_the_grace_only() -> None:
    # The owner has applied at least what this standby has, so it has no position to wait
    # for: asked with no wait of its own, and the standby answers if it stays silent.
    routing, peers = Routing("http://dead"), Peers()
    reads = queries(routing, Local(Standby()), peers)
    reads.position = lambda copy: ReadPosition(2, {"item-events": {2: 10}}, 0, None)  # type: ignore[method-assign]
    answer = asyncio.run(reads.read(QUERY, forwarded_by=None))
    assert answer.status == 200  # the best of the other copies (here another worker's)
    assert peers.asked[0][0] == "http://dead"
    assert peers.asked[0][2] == 0.0  # no wait: the grace alone
    assert peers.graces[0] == ANSWER_GRACE_S


def test_a_read_no_copy_answers_asks_again_until_the_group_has_rebalanced() -> None:
    routing, peers = Routing("http://dead"), Peers()
    reads = queries(routing, Local(None), peers)
    plain = KeyQuery(TABLE, "store-1", b"store-1", 2)

    async def run() -> Any:
        async def rebalance() -> None:
            await asyncio.sleep(1.0)  # the dead owner is removed; the new one takes over
            routing.current = "http://new"

        mover = asyncio.create_task(rebalance())
        peers.get = no_answer_until_moved(peers, routing)  # type: ignore[method-assign]
        answer = await reads.read(plain, forwarded_by=None)
        await mover
        return answer

    answer = asyncio.run(run())
    assert answer.status == 200
    assert answer.body["value"] == {"new": True}
    assert peers.asked[-1][0] == "http://new"
    assert len(peers.asked) > 3  # asked again while the group rebalanced


def no_answer_until_moved(peers: Peers, routing: Routing) -> Any:
    """Before the move, no copy answers (the standby's worker is rebalancing too)."""
    answer = peers.get

    async def get(base: str, path: str, params: dict[str, Any], **kw: Any) -> Any:
        if routing.current != "http://new":
            peers.asked.append((base, params.get("timeout_ms"), kw.get("wait", 0.0)))
            return None
        return await answer(base, path, params, **kw)

    return get


class Active:
    """This worker's active copy of the partition."""

    replica = "active"
    offset_lag = 0

    def stored_position(self) -> None:
        return None

    def get(self, raw: bytes) -> Any:
        return {"stock": 3}


def test_a_token_read_is_answered_at_once_when_the_copy_holds_its_position() -> None:
    reads = queries(Routing("http://me"), Local(Active()), Peers())
    reads.position = lambda copy, **kw: ReadPosition(2, {"item-events": {2: 10}}, 0, None)  # type: ignore[method-assign]
    answer = reads.read_now(QUERY, forwarded_by=None)
    assert answer is not None
    assert (answer.status, answer.body["value"]) == (200, {"stock": 3})
    # a copy short of the token's position: the read waits (read_now leaves it to read)
    reads.position = lambda copy, **kw: ReadPosition(2, {"item-events": {2: 9}}, 0, None)  # type: ignore[method-assign]
    assert reads.read_now(QUERY, forwarded_by=None) is None
    # and a standby answers a token read at once only when it was forwarded to it
    reads = queries(Routing("http://me"), Local(Standby()), Peers())
    reads.position = lambda copy, **kw: ReadPosition(2, {"item-events": {2: 10}}, 0, None)  # type: ignore[method-assign]
    assert reads.read_now(QUERY, forwarded_by=None) is None
    assert reads.read_now(QUERY, forwarded_by="http://peer") is not None


class Sources:
    """The positions' lineage: item-events feeds inventory directly."""

    sources = frozenset({"item-events", "text-lines"})
    partitions = 4

    def sources_of(self, table: str) -> dict[str, str]:
        return {"item-events": "direct"}

    def feeding(self, table: str, topic: str, partition: int) -> list[int]:
        return [partition]


def test_what_a_token_asks_of_a_partition_is_worked_out_once() -> None:
    reads = queries(Routing("http://me"), Local(None), Peers())
    reads.app_id, reads.positions, reads._consistencies = "app", Sources(), {}  # type: ignore[assignment]
    token = encode_token(Token("item-events", {2: 10, 3: 4}), "app")
    options = ReadOptions(consistent_with=token)
    first = reads.consistency(TABLE, 2, options)
    assert (first.topic, first.wanted, first.timeout_ms) == (
        "item-events",
        {2: 10},
        DEFAULT_WAIT_MS,
    )
    assert reads.consistency(TABLE, 2, ReadOptions(consistent_with=token)) is first
    assert reads.consistency(TABLE, 3, options).wanted == {3: 4}
    assert reads.consistency(TABLE, 2, ReadOptions(token, timeout_ms=5)).timeout_ms == 5
    # a token that does not feed the table, or is no token, is refused every time
    other = encode_token(Token("text-lines", {2: 1}), "app")
    for _ in range(2):
        with pytest.raises(BadRequest, match="does not feed"):
            reads.consistency(TABLE, 2, ReadOptions(consistent_with=other))
        with pytest.raises(BadRequest, match="consistent_with"):
            reads.consistency(TABLE, 2, ReadOptions(consistent_with="garbage"))


class Silent(Peers):
    """The owner hangs; the other peers answer as their own copies do (or not at all)."""

    def __init__(self, answers: dict[str, PeerAnswer]) -> None:
        super().__init__()
        self.answers = answers

    def answer(self, base: str) -> PeerAnswer | None:
        return self.answers.get(base)


BOUNDED = KeyQuery(TABLE, "store-1", b"store-1", 2, consistency=Consistency(max_lag_records=0))


def stale(url: str, lag: int) -> PeerAnswer:
    """A peer's standby beyond the read's bound, as it answers a forwarded read."""
    position = {"partition": 2, "applied": {"item-events": {"2": 8}}, "lag_records": lag}
    body = {"detail": f"standby copy: lag_records {lag} exceeds max_lag_records 0"}
    return PeerAnswer(url, 503, {**body, "position": {**position, "lag_ms": 40}})


def test_a_bounded_read_no_copy_serves_answers_with_the_local_standbys_position(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("api.queries.BOUNDED_PATIENCE_S", 0.0)
    reads = queries(Routing("http://dead"), Local(Standby()), Silent({}))
    with pytest.raises(NoReplica) as refused:
        asyncio.run(reads.read(BOUNDED, forwarded_by=None))
    assert refused.value.body()["position"] == STANDBY_POSITION.as_dict()
    assert "max_lag_records 0" in refused.value.detail
    assert refused.value.headers["Retry-After"]


def test_of_copies_beyond_the_bound_the_read_answers_the_position_of_the_least_behind(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("api.queries.BOUNDED_PATIENCE_S", 0.0)
    peers = Silent({"http://new": stale("http://new", 1)})
    reads = queries(Routing("http://dead"), Local(Standby()), peers)  # the local one: 5
    with pytest.raises(NoReplica) as refused:
        asyncio.run(reads.read(BOUNDED, forwarded_by=None))
    assert refused.value.body()["position"] == stale("http://new", 1).body["position"]
    assert "http://new" in refused.value.detail
    # with no copy of its own, the worker answers with the peer's position too
    reads = queries(Routing("http://dead"), Local(None), peers)
    with pytest.raises(NoReplica) as refused:
        asyncio.run(reads.read(BOUNDED, forwarded_by=None))
    assert refused.value.body()["position"]["lag_records"] == 1


def test_a_read_no_copy_answers_at_all_is_a_503_without_a_position() -> None:
    reads = queries(Routing("http://dead"), Local(None), Silent({}))
    reads.patience_s = 0.0
    plain = KeyQuery(TABLE, "store-1", b"store-1", 2)
    with pytest.raises(NoReplica, match="may be rebalancing") as refused:
        asyncio.run(reads.read(plain, forwarded_by=None))
    assert "position" not in refused.value.body()
