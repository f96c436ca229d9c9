"""faust's committable offsets, with app/commits.py's fixes: pure bookkeeping."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from typing import Any

from intervaltree import IntervalTree  # type: ignore[import-untyped]

from app.commits import commit_before_revoke, dedupe_acked

TP = ("text-lines", 2)


class Diag:
    def __init__(self) -> None:
        self.flags: set[str] = set()

    def set_flag(self, flag: str) -> None:
        self.flags.add(flag)

    def unset_flag(self, flag: str) -> None:
        self.flags.discard(flag)


class Consumer:
    """The attributes faust's consumer keeps per partition."""

    def __init__(self) -> None:
        self._acked: defaultdict[Any, list[int]] = defaultdict(list)
        self._acked_index: defaultdict[Any, set[int]] = defaultdict(set)
        self._gap: defaultdict[Any, IntervalTree] = defaultdict(IntervalTree)
        self._committed_offset: defaultdict[Any, int | None] = defaultdict(lambda: None)
        self._read_offset: dict[Any, int] = {}
        self._active_partitions: set[Any] | None = {TP}
        self._paused_partitions: set[Any] = set()
        self.diag = Diag()
        self.seen_at_commit: list[int] | None = None

    async def _on_partitions_revoked(self, revoked: set[Any]) -> None:
        # the app's handler: waits for the streams, then commits from the bookkeeping
        self.seen_at_commit = list(self._acked.get(TP, []))


def test_an_offset_both_acked_and_in_a_gap_does_not_cut_the_commit_short() -> None:
    consumer: Any = Consumer()
    dedupe_acked(consumer)
    consumer._committed_offset[TP] = 31
    consumer._acked[TP] = [31, 32, 33, 34, 35]
    consumer._acked_index[TP] = {31, 32, 33, 34, 35}
    consumer._gap[TP].addi(32, 33)  # offset 32 seen as a gap too
    assert consumer._new_offset(TP) == 36
    assert consumer._acked[TP] == []
    assert consumer._acked_index[TP] == set()
    assert not consumer._gap[TP]


def test_the_commit_stops_at_the_first_offset_not_acked() -> None:
    consumer: Any = Consumer()
    dedupe_acked(consumer)
    consumer._committed_offset[TP] = 10
    consumer._acked[TP] = [14, 10, 11, 15]
    consumer._acked_index[TP] = {10, 11, 14, 15}
    assert consumer._new_offset(TP) == 12
    assert consumer._acked[TP] == [14, 15]
    # 12 and 13 not acked: nothing more to commit until they are
    consumer._committed_offset[TP] = 12
    assert consumer._new_offset(TP) is None
    consumer._gap[TP].addi(12, 14)  # offsets 12-13 hold no records
    assert consumer._new_offset(TP) == 16
    assert consumer._new_offset(("text-lines", 3)) is None  # nothing acked there


def test_the_revocation_commit_still_sees_what_was_acked() -> None:
    consumer: Any = Consumer()
    commit_before_revoke(consumer)
    consumer._acked[TP] = [5, 6, 7]
    consumer._committed_offset[TP] = 5
    asyncio.run(consumer.on_partitions_revoked({TP}))
    assert consumer.seen_at_commit == [5, 6, 7]
    assert TP not in consumer._acked
    assert TP not in consumer._committed_offset
    assert consumer._active_partitions == set()
    assert consumer.diag.flags == set()
