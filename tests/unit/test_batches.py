"""The per-batch word count and the commit gate: pure logic over plain records."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from agents.words import REPARTITION_TOPIC, added_counts, chunks, split_batch
from app.semantics import tokenize
from app.settings import Settings
from app.topics import partition_for
from tables.batch import BatchProcessor, CommitGate, Output, by_partition


@dataclass(frozen=True)
class TP:
    topic: str
    partition: int


@dataclass
class Message:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: Any

    @property
    def tp(self) -> TP:
        return TP(self.topic, self.partition)


@dataclass
class Event:
    message: Message

    @property
    def key(self) -> Any:
        return self.message.key

    @property
    def value(self) -> Any:
        return self.message.value


class Letters:
    """Stands in for DeadLetters: records what would be dead-lettered."""

    def __init__(self) -> None:
        self.reasons: list[str] = []

    def record_of(self, message: Message, reason: str) -> Output:
        self.reasons.append(reason)
        return Output(f"{message.topic}-dlq", message.key, message.value)


def lines(partition: int, texts: Sequence[bytes | None], first: int = 0) -> list[Message]:
    """Fetched text-lines records, as the split stage gets them."""
    return [Message("text-lines", partition, first + n, None, text) for n, text in enumerate(texts)]


def test_chunks_keep_every_count_and_stay_near_the_limit() -> None:
    counts = {f"word{n}": n for n in range(1000)}
    pieces = list(chunks(counts, limit=2000))
    assert len(pieces) > 1
    merged: dict[str, int] = {}
    for piece in pieces:
        assert len(orjson.dumps(piece)) <= 2000
        merged.update(piece)
    assert merged == counts


def test_a_word_longer_than_the_limit_gets_a_record_of_its_own() -> None:
    long = "x" * 5000
    pieces = list(chunks({"a": 1, long: 2, "b": 3}, limit=100))
    assert {long: 2} in pieces
    assert sum(len(p) for p in pieces) == 3


def test_split_sends_each_word_once_to_its_partition_with_its_batch_count() -> None:
    texts = [b"The cat and the hat", "état Straße état".encode(), b"it's  cat_9 THE"]
    records = lines(3, texts, first=40)
    letters = Letters()
    batch = split_batch(TP("text-lines", 3), records, Settings(), letters, partitions=8)  # type: ignore[arg-type]
    assert batch.last_offset == 42
    want = Counter(w for t in texts for w in tokenize(t.decode()))
    got: Counter[str] = Counter()
    for out in batch.outputs:
        assert out.topic == REPARTITION_TOPIC
        assert out.headers == [("source", b"text-lines:3:40-42")]
        for word, count in orjson.loads(out.value or b"{}").items():
            assert partition_for(word.encode(), 8) == out.partition
            assert word not in got
            got[word] = count
    assert got == want
    assert not letters.reasons


def test_split_dead_letters_bad_lines_and_counts_the_rest() -> None:
    texts: list[bytes | None] = [
        b"good words",
        b"\xff\xfe not utf-8",
        b"more good",
        b"x" * 70_000,
        None,
    ]
    records = lines(0, texts)
    letters = Letters()
    batch = split_batch(TP("text-lines", 0), records, Settings(), letters, partitions=8)  # type: ignore[arg-type]
    dead = [o for o in batch.outputs if o.topic == "text-lines-dlq"]
    assert [o.value for o in dead] == [b"\xff\xfe not utf-8", b"x" * 70_000, None]
    assert "not UTF-8" in letters.reasons[0]
    assert "exceeds the limit" in letters.reasons[1]
    assert "missing" in letters.reasons[2]
    counted: Counter[str] = Counter()
    for out in batch.outputs:
        if out.topic == REPARTITION_TOPIC:
            counted.update(orjson.loads(out.value or b"{}"))
    assert counted == Counter({"good": 2, "words": 1, "more": 1})


def test_added_counts_reads_both_record_formats() -> None:
    events = [
        Event(Message(REPARTITION_TOPIC, 1, 0, None, {"cat": 2, "état": 1})),
        Event(Message(REPARTITION_TOPIC, 1, 1, b"cat", 3)),
        Event(Message(REPARTITION_TOPIC, 1, 2, None, {"cat": 1})),
    ]
    assert added_counts(events) == Counter({b"cat": 6, "état".encode(): 1})


def test_events_are_grouped_by_partition_in_arrival_order() -> None:
    records = lines(1, [b"a", b"b"], first=5) + lines(2, [b"c"]) + lines(1, [b"d"], first=7)
    events = [Event(record) for record in records]
    groups = by_partition(events)
    assert [e.message.offset for e in groups[TP("text-lines", 1)]] == [5, 6, 7]
    assert [e.message.offset for e in groups[TP("text-lines", 2)]] == [0]


class Consumer:
    """The two methods of a faust consumer the gate wraps."""

    def __init__(self, acked: dict[TP, int], committed: dict[TP, int]) -> None:
        self.acked, self.committed = acked, committed

    def _filter_committable_offsets(self, tps: Any) -> dict[TP, int]:
        return {tp: self.acked[tp] for tp in tps if tp in self.acked}

    def _should_commit(self, tp: TP, offset: int) -> bool:
        return offset > self.committed.get(tp, -1)


def test_the_gate_commits_no_further_than_applied_batches() -> None:
    lines_tp, other = TP("text-lines", 0), TP("item-events", 0)
    consumer = Consumer({lines_tp: 90, other: 50}, {lines_tp: 10})
    gate = CommitGate()
    gate.topics.add("text-lines")
    gate.install(consumer)
    tps = [lines_tp, other]
    # nothing applied yet: the gated partition commits nothing; others as faust says
    assert consumer._filter_committable_offsets(tps) == {other: 50}
    gate.applied[lines_tp] = 40
    assert consumer._filter_committable_offsets(tps) == {lines_tp: 40, other: 50}
    gate.applied[lines_tp] = 120  # applied beyond what faust saw acked
    assert consumer._filter_committable_offsets(tps)[lines_tp] == 90
    gate.poisoned.add(lines_tp)
    assert lines_tp not in consumer._filter_committable_offsets(tps)
    gate.forget([lines_tp])
    gate.own_commits = True  # exactly_once: each batch commits in its transaction
    assert consumer._filter_committable_offsets(tps) == {other: 50}
    gate.shared.add("text-lines")  # read by another agent too: faust's acks count theirs
    assert consumer._filter_committable_offsets(tps) == {lines_tp: 90, other: 50}
    gate.applied[lines_tp] = 60
    assert consumer._filter_committable_offsets(tps) == {lines_tp: 60, other: 50}


@dataclass
class Conf:
    processing_guarantee: str = "at_least_once"


@dataclass
class App:
    conf: Conf


def test_a_shared_topic_commits_no_further_than_its_slowest_reader() -> None:
    processor = BatchProcessor(App(Conf()))  # type: ignore[arg-type]
    tp = TP("item-events", 3)
    assert processor._shared_bound(tp) is None  # nobody else reads it
    progress: dict[str, int | None] = {"settling": None, "audit": 80}
    processor.share("item-events", lambda _: progress["settling"])
    processor.share("item-events", lambda _: progress["audit"])
    assert processor.gate.shared == {"item-events"}
    assert processor.applied_table is None  # at_least_once: faust's acks bound the commit
    # one reader has not said how far it has gone: nothing may be committed for it
    assert processor._shared_bound(tp) is None
    progress["settling"] = 95
    assert processor._shared_bound(tp) == 80
    progress["audit"] = 120
    assert processor._shared_bound(tp) == 95
