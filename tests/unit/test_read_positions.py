"""Read positions: what a stored position gives each read, and the positions of active
copies held from the engine's cycles."""

from __future__ import annotations

import time

from aiokafka import TopicPartition

from api.positions import HeldPositions, InputEnds, Positions
from api.queries import Consistency
from tables.positions import Lineage, Position


class Ends:
    """End offsets of the input partitions, as the background refresh would know them."""

    def __init__(self, ends: dict[tuple[str, int], int]) -> None:
        self.ends = ends
        self.first_seen = time.monotonic() - 2.0

    def end(self, topic: str, partition: int) -> int | None:
        return self.ends.get((topic, partition))

    def age_ms(self, topic: str, partition: int, offset: int, now: float) -> int:
        return (
            round((now - self.first_seen) * 1000) if self.ends[(topic, partition)] > offset else 0
        )


def positions(ends: Ends) -> Positions:
    lineage = Lineage(
        internal=frozenset({"counts-repartition"}),
        feeds={"counts": frozenset({"counts-repartition"}), "totals": frozenset({"lines"})},
        senders={"counts-repartition": frozenset({"lines"})},
    )
    return Positions(lineage, 4, ["lines"], ends)  # type: ignore[arg-type]


def test_a_position_is_read_anew_when_the_stored_one_changes_and_lag_follows_the_ends() -> None:
    ends = Ends({("lines", 2): 10})
    found = positions(ends)
    first = found.of("totals", 2, Position({"lines": {2: 7}}).encode())
    assert (first.applied, first.lag_records) == ({"lines": {2: 7}}, 3)
    assert first.lag_ms is not None
    assert first.lag_ms >= 1900
    assert first.as_dict()["applied"] == {"lines": {"2": 7}}
    ends.ends[("lines", 2)] = 12  # the input moved on; the copy did not
    assert found.of("totals", 2, Position({"lines": {2: 7}}).encode()).lag_records == 5
    moved = found.of("totals", 2, Position({"lines": {2: 12}}).encode())
    assert (moved.applied, moved.lag_records, moved.lag_ms) == ({"lines": {2: 12}}, 0, 0)
    upstream = found.of("counts", 1, Position({"lines": {0: 4, 3: 9}}).encode())
    assert upstream.applied == {"lines": {0: 4, 1: 0, 2: 0, 3: 9}}  # every partition feeds it
    assert found.of("totals", 3, None).as_dict()["applied"] == {"lines": {"3": 0}}
    unknown = found.of("totals", 3, None)
    assert (unknown.lag_records, unknown.lag_ms) == (None, None)  # the end is not known yet
    refused = Consistency(max_lag_ms=0).beyond(unknown)
    assert refused == "lag_ms None exceeds max_lag_ms 0"


def test_records_a_worker_writes_count_in_its_lag_before_the_next_read_of_the_ends() -> None:
    ends = InputEnds("127.0.0.1:1", ["lines"], 2, read_committed=False)  # never started
    now = time.monotonic()
    ends.observe({TopicPartition("lines", 0): 10}, now - 1.0)
    ends.written("lines", {0: 12, 1: 3}, now)
    assert (ends.end("lines", 0), ends.end("lines", 1)) == (12, 3)
    ends.written("lines", {0: 11}, now)  # an end behind one seen already is no news
    assert ends.end("lines", 0) == 12
    copy = Positions(Lineage(frozenset(), {"totals": frozenset({"lines"})}, {}), 2, ["lines"], ends)
    stale = copy.of("totals", 0, Position({"lines": {0: 10}}).encode())
    assert stale.lag_records == 2
    assert Consistency(max_lag_records=0).beyond(stale) is not None


def test_held_positions_read_the_store_once_follow_cycles_and_forget_on_revocation() -> None:
    held = HeldPositions()
    reads: list[str] = []

    def stored(value: bytes | None) -> object:
        def read() -> bytes | None:
            reads.append("db")
            return value

        return read

    assert held.get("counts", 1, stored(b"p1")) == b"p1"  # type: ignore[arg-type]
    assert held.get("counts", 1, stored(b"other")) == b"p1"  # type: ignore[arg-type]
    assert reads == ["db"]
    held.moved("counts", 1, b"p2")
    held.moved("counts", 1, None)  # a cycle that wrote no position keeps the last one
    assert held.get("counts", 1, stored(b"other")) == b"p2"  # type: ignore[arg-type]
    held.moved("totals", 0, b"t1")  # a copy not read yet
    assert held.get("totals", 0, stored(b"other")) == b"t1"  # type: ignore[arg-type]
    assert reads == ["db"]
    held.forget()
    assert held.get("counts", 1, stored(b"p9")) == b"p9"  # type: ignore[arg-type]
    assert reads == ["db", "db"]


def test_a_token_naming_a_partition_its_topic_lacks_is_refused() -> None:
    import pytest

    from api.errors import BadRequest
    from api.queries import Queries, ReadOptions
    from api.routing import QueryTable
    from api.tokens import Token, encode_token

    reads = Queries.__new__(Queries)
    reads.app_id = "streamstate"
    reads.positions = positions(Ends({}))
    reads._consistencies = {}
    table = QueryTable("totals", "table", "streamstate-totals-changelog", 4, 0)
    forged = encode_token(Token("lines", {99: 1}), "streamstate")
    with pytest.raises(BadRequest, match="names partition 99 of lines, which has 4"):
        reads.consistency(table, 1, ReadOptions(forged, 1000))
    fine = reads.consistency(
        table, 1, ReadOptions(encode_token(Token("lines", {1: 5}), "streamstate"))
    )
    assert fine.wanted == {1: 5}
