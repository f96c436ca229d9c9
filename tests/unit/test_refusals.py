"""Records Kafka refuses, over the in-process log of tests/unit/test_engine.py, whose
topics enforce size, key and timestamp rules on each record batch as a broker does.

A refused record is its inputs' problem, not the partition's: the input records whose
effects it carries go to their dead-letter topic with the reason, nothing of theirs
takes effect, and the rest of the cycle does. A cycle that fails for another reason is
tried again after a backoff, without stopping the other partitions.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import orjson
import pytest

from core.topics import dlq_topic
from tables.engine import BACKOFF_CAP_S, ISOLATE_AFTER, TP, Engine
from tables.limits import TopicLimits
from tables.pipeline import (
    ERROR_HEADER,
    Batch,
    Output,
    Pipeline,
    TableSpec,
    TableView,
    fresh_copy,
)
from tables.refusals import SendPlan
from tests.support.clock import Clock
from tests.unit.test_engine import (
    PARTITIONS,
    Log,
    LogConnector,
    LogProducer,
    MemoryTable,
    offer_next,
    run,
)

CHANGELOG = "streamstate-t-changelog"


def growing(*, first: Sequence[Pipeline] = ()) -> list[Pipeline]:
    """``in`` records ``key=text``: the table's value of ``key`` grows by ``text``, and
    ``text`` goes to ``out``; ``first``: pipelines that run before it."""

    def process(batch: Batch) -> None:
        table = batch.table("t")
        for record in batch.of("in"):
            assert record.value is not None
            key, _, text = record.value.partition(b"=")
            table.put(key, (table.get(key) or "") + text.decode())
            batch.send("out", key, text, partition=record.partition)

    grow = Pipeline(
        "grow",
        reads=("in",),
        writes=(TableSpec("t"),),
        produces=("out", dlq_topic("in")),
        process=process,
    )
    return [*first, grow]


def counting() -> Pipeline:
    """Counts the ``in`` records of each key in table ``c``."""

    def process(batch: Batch) -> None:
        table = batch.table("c")
        for record in batch.of("in"):
            assert record.value is not None
            key = record.value.partition(b"=")[0]
            table.put(key, (table.get(key) or 0) + 1)

    return Pipeline("count", reads=("in",), writes=(TableSpec("c"),), process=process)


def engine_over(
    connector: LogConnector, pipelines: list[Pipeline], tables: Mapping[str, MemoryTable]
) -> Engine:
    return Engine(
        pipelines,
        dict(tables),
        connector,
        partitions=PARTITIONS,
        exactly_once=connector.exactly_once,
    )


def write(log: Log, values: Sequence[bytes], partition: int = 0) -> None:
    for value in values:
        log.append(TP("in", partition), None, value, timestamp=int(time.time() * 1000))


def dead_letters(log: Log) -> dict[bytes, str]:
    """Each dead letter's value -> its error header."""
    found = {}
    for record in log.topic(dlq_topic("in")):
        assert record.value is not None
        found[record.value] = dict(record.headers)[ERROR_HEADER].decode()
    return found


def outputs(log: Log) -> Counter[bytes]:
    return Counter(r.value for r in log.topic("out") if r.value is not None)


GUARANTEES = pytest.mark.parametrize("exactly_once", [False, True])


@GUARANTEES
def test_an_output_larger_than_its_topic_takes_sends_its_input_to_the_dead_letters(
    exactly_once: bool,
) -> None:
    log = Log(rules={"out": TopicLimits(max_message_bytes=200)})
    write(log, [b"a=1", b"b=" + b"x" * 300, b"a=2", b"c=3"])
    connector = LogConnector(log, exactly_once)
    table = MemoryTable("t")
    run(engine_over(connector, growing(), {"t": table}), connector, limit=10)
    assert table.values() == {b"a": "12", b"c": "3"}
    assert outputs(log) == {b"1": 1, b"2": 1, b"3": 1}
    [(value, error)] = dead_letters(log).items()
    assert value == b"b=" + b"x" * 300
    assert error.startswith("MessageSizeTooLargeError: the record is 3")
    assert "topic out takes at most 200 (max.message.bytes)" in error
    assert log.committed[TP("in", 0)] == 4


@GUARANTEES
def test_a_value_that_outgrows_its_changelog_refuses_each_record_that_would_grow_it(
    exactly_once: bool,
) -> None:
    log = Log(rules={CHANGELOG: TopicLimits(max_message_bytes=200, compacted=True)})
    values = [b"k=" + bytes([65 + n]) * 30 for n in range(8)] + [b"j=small"]
    write(log, values)
    connector = LogConnector(log, exactly_once)
    table = MemoryTable("t")
    run(engine_over(connector, growing(), {"t": table}), connector, limit=3)
    kept = table.values()[b"k"]
    assert isinstance(kept, str)
    assert 0 < len(kept) < 8 * 30
    assert len(kept) % 30 == 0
    refused = dead_letters(log)
    assert set(refused) == set(values[len(kept) // 30 : 8])
    assert all(
        e.startswith("MessageSizeTooLargeError") and "key b'k'" in e for e in refused.values()
    )
    assert table.values()[b"j"] == "small"
    # the changelog never carried a value its topic refuses, and says what the store says
    latest = {r.key: orjson.loads(r.value or b"null") for r in log.topic(CHANGELOG)}
    assert latest[b"k"] == kept


@pytest.mark.parametrize("order", ["counted_first", "counted_after"])
def test_a_refused_record_changes_no_table_of_any_pipeline(order: str) -> None:
    log = Log(rules={"out": TopicLimits(max_message_bytes=200)})
    write(log, [b"a=1", b"a=" + b"x" * 300, b"a=2"])
    connector = LogConnector(log, exactly_once=True)
    counts, table = MemoryTable("c"), MemoryTable("t")
    pipelines = growing(first=[counting()]) if order == "counted_first" else growing()
    if order == "counted_after":
        pipelines.append(counting())
    engine = engine_over(connector, pipelines, {"t": table, "c": counts})
    run(engine, connector, limit=10)
    assert counts.values() == {b"a": 2}
    assert table.values() == {b"a": "12"}
    assert len(dead_letters(log)) == 1


@GUARANTEES
def test_a_null_key_for_a_compacted_topic_is_refused_before_sending(exactly_once: bool) -> None:
    def keyless(batch: Batch) -> None:
        for record in batch.of("in"):
            key = None if record.value == b"none" else record.value
            batch.send("compacted", key, b"v", partition=0)

    log = Log(rules={"compacted": TopicLimits(compacted=True)})
    write(log, [b"a", b"none", b"b"])
    connector = LogConnector(log, exactly_once)
    pipeline = Pipeline("keyless", reads=("in",), produces=("compacted",), process=keyless)
    run(engine_over(connector, [pipeline], {}), connector, limit=10)
    assert [r.key for r in log.topic("compacted")] == [b"a", b"b"]
    [(value, error)] = dead_letters(log).items()
    assert value == b"none"
    assert error.startswith("InvalidRecordError: topic compacted is compacted")


def stamping(explicit: bool) -> Pipeline:
    """Sends each record's value to ``out``, timed with the value as epoch ms when
    ``explicit``."""

    def process(batch: Batch) -> None:
        for record in batch.of("in"):
            assert record.value is not None
            at = int(record.value) if explicit else None
            batch.send("out", record.value, record.value, partition=0, timestamp_ms=at)

    return Pipeline("stamp", reads=("in",), produces=("out",), process=process)


@GUARANTEES
def test_outputs_take_their_inputs_time_or_the_clock_when_their_topic_would_refuse_it(
    exactly_once: bool,
) -> None:
    now = int(time.time() * 1000)
    log = Log(rules={"out": TopicLimits(after_max_ms=3_600_000)})
    records = {"in time": now - 5_000, "2 h ahead": now + 7_200_000, "years behind": 0}
    for name, at in records.items():
        log.append(TP("in", 0), None, name.encode(), timestamp=at)
    connector = LogConnector(log, exactly_once)
    run(engine_over(connector, [stamping(explicit=False)], {}), connector, limit=1)
    sent = {r.value: r.timestamp for r in log.topic("out")}
    assert sent[b"in time"] == records["in time"]
    assert sent[b"years behind"] == 0  # the topic takes any time behind
    assert now <= sent[b"2 h ahead"] <= int(time.time() * 1000)  # the clock: not refused
    assert not dead_letters(log)


@GUARANTEES
def test_an_explicit_timestamp_its_topic_refuses_sends_its_input_to_the_dead_letters(
    exactly_once: bool,
) -> None:
    now = int(time.time() * 1000)
    log = Log(rules={"out": TopicLimits(after_max_ms=3_600_000)})
    ahead = str(now + 7_200_000).encode()
    write(log, [str(now).encode(), ahead])
    connector = LogConnector(log, exactly_once)
    run(engine_over(connector, [stamping(explicit=True)], {}), connector, limit=10)
    assert [r.value for r in log.topic("out")] == [str(now).encode()]
    [(value, error)] = dead_letters(log).items()
    assert value == ahead
    assert error.startswith("InvalidTimestampError: topic out: timestamp")
    assert "(message.timestamp.after.max.ms)" in error


@GUARANTEES
def test_a_refusal_the_checks_did_not_foresee_is_attributed_through_kafkas_answer(
    exactly_once: bool,
) -> None:
    # The worker read the topic's rules before they changed: only Kafka knows them.
    log = Log(rules={"out": TopicLimits(max_message_bytes=200)})
    values = [b"a=1", b"b=" + b"x" * 300, b"a=2", b"c=3"]
    write(log, values)
    connector = LogConnector(log, exactly_once, rules={})
    table = MemoryTable("t")
    engine = engine_over(connector, growing(), {"t": table})
    run(engine, connector, limit=10)
    assert table.values() == {b"a": "12", b"c": "3"}
    [(value, error)] = dead_letters(log).items()
    assert value == b"b=" + b"x" * 300
    assert error.startswith("MessageSizeTooLargeError")
    assert error.endswith("(topic out partition 0)")
    # at_least_once too: an attempt at once does not send again what Kafka took before
    assert outputs(log) == {b"1": 1, b"2": 1, b"3": 1}
    assert engine.figures.retries["refusal"] >= 2
    assert engine.stalled() == []


@GUARANTEES
def test_rules_read_again_after_kafkas_refusal_find_the_culprit_before_sending(
    exactly_once: bool,
) -> None:
    log = Log(rules={"out": TopicLimits(max_message_bytes=200)})
    write(log, [b"a=1", b"b=" + b"x" * 300, b"c=3"])
    connector = LogConnector(log, exactly_once, rules={})
    engine = engine_over(connector, growing(), {"t": MemoryTable("t")})

    async def go() -> None:
        await offer_next(engine, connector, 10)  # the task starts: the stale rules read
        connector.rules = None  # from now on the broker describes the topic as it is
        for _ in range(3):
            await offer_next(engine, connector, 10)

    asyncio.run(go())
    [(_, error)] = dead_letters(log).items()
    assert error.startswith("MessageSizeTooLargeError: the record is")  # the engine's check
    assert engine.limits.of("out").max_message_bytes == 200


@GUARANTEES
def test_a_dead_letter_larger_than_its_topic_takes_keeps_its_headers_without_the_value(
    exactly_once: bool,
) -> None:
    log = Log(
        rules={
            "out": TopicLimits(max_message_bytes=200),
            dlq_topic("in"): TopicLimits(max_message_bytes=300),
        }
    )
    write(log, [b"b=" + b"x" * 400, b"a=1"])
    connector = LogConnector(log, exactly_once)
    run(engine_over(connector, growing(), {"t": MemoryTable("t")}), connector, limit=10)
    [letter] = log.topic(dlq_topic("in"))
    headers = dict(letter.headers)
    assert letter.value is None
    assert headers["source-offset"] == b"0"
    assert b"the value (402 bytes) is left out" in headers[ERROR_HEADER]
    assert outputs(log) == {b"1": 1}


class FlakyConnector(LogConnector):
    """Every send of partition 0's task fails with an error no record explains."""

    def producer(self, partition: int, *, transactional: bool) -> LogProducer:
        producer = super().producer(partition, transactional=transactional)
        if partition == 0:
            producer.fail = [True]
        return producer


@GUARANTEES
def test_a_cycle_that_keeps_failing_backs_off_and_the_other_partitions_go_on(
    exactly_once: bool, clock: Clock
) -> None:
    log = Log()
    write(log, [b"a=1", b"a=2"], partition=0)
    write(log, [b"b=1", b"b=2"], partition=1)
    connector = FlakyConnector(log, exactly_once)
    table = MemoryTable("t")
    engine = engine_over(connector, growing(), {"t": table})
    waits = []

    async def go() -> None:
        for _ in range(40):
            await offer_next(engine, connector, 10)
            stall = engine.stalls.get(0)
            if stall is not None and stall.paused:
                waits.append(stall.retry_at - clock.now)
                clock.advance(stall.retry_at - clock.now)
                await engine.tick()

    asyncio.run(go())
    assert table.values() == {b"b": "12"}  # partition 1 went on
    assert log.committed[TP("in", 1)] == 2
    assert TP("in", 0) not in log.committed
    assert waits[:7] == [1.0, 2.0, 4.0, 8.0, 16.0, BACKOFF_CAP_S, BACKOFF_CAP_S]
    [report] = engine.stalled()
    assert report["partition"] == 0
    assert report["inputs"] == {"in": 0}
    assert "the broker went away" in report["reason"]
    assert report["error"] == "ConnectionError"
    assert report["attempts"] == len(waits)


@dataclass
class StateFails(LogConnector):
    """Kafka takes a cycle's outputs and then fails its changelog records, ``times``
    times over."""

    times: int = 3

    def producer(self, partition: int, *, transactional: bool) -> LogProducer:
        return FailingState(self.log, self.fail, connector=self)


@dataclass
class FailingState(LogProducer):
    connector: StateFails | None = None

    async def send(self, records: Sequence[Output], plan: SendPlan) -> dict[TP, int]:
        changelog = any(out.topic == CHANGELOG for out in records)
        if self.connector is not None and self.connector.times > 0 and changelog:
            self.connector.times -= 1
            raise TimeoutError("the changelog's leader did not answer")
        return await super().send(records, plan)


def test_at_least_once_sends_a_failed_cycles_outputs_again_at_most_once_per_attempt(
    clock: Clock,
) -> None:
    log = Log()
    write(log, [b"a=1", b"a=2", b"a=3"])
    connector = StateFails(log, exactly_once=False)
    table = MemoryTable("t")
    engine = engine_over(connector, growing(), {"t": table})

    async def go() -> None:
        for _ in range(20):
            await offer_next(engine, connector, 10)
            clock.advance(60)
            await engine.tick()

    asyncio.run(go())
    assert table.values() == {b"a": "123"}
    attempts = 3 + 1
    assert outputs(log) == {b"1": attempts, b"2": attempts, b"3": attempts}
    assert engine.stalled() == []


class Policy(Exception):
    """An error Kafka answers for one record that no rule of the engine's knows."""


class PolicyLog(Log):
    def refuses(self, topic: str, batch: Sequence[Output]) -> Exception | None:
        if any(out.value == b"forbidden" for out in batch):
            return Policy("the broker's policy refuses it")
        return super().refuses(topic, batch)


@GUARANTEES
def test_a_record_kafka_keeps_refusing_for_an_unknown_reason_goes_to_the_dead_letters(
    exactly_once: bool, clock: Clock
) -> None:
    log = PolicyLog()
    write(log, [b"a=1", b"a=forbidden", b"a=2", b"b=3"])
    connector = LogConnector(log, exactly_once)
    table = MemoryTable("t")
    engine = engine_over(connector, growing(), {"t": table})

    async def go() -> None:
        for _ in range(30):
            await offer_next(engine, connector, 10)
            clock.advance(60)
            await engine.tick()

    asyncio.run(go())
    assert table.values() == {b"a": "12", b"b": "3"}
    [(value, error)] = dead_letters(log).items()
    assert value == b"a=forbidden"
    assert error.startswith("Policy: the broker's policy refuses it (topic out partition 0)")
    assert engine.figures.retries["backoff"] >= ISOLATE_AFTER
    assert engine.stalled() == []


def test_refused_records_are_counted_by_source_topic_and_kafkas_error() -> None:
    log = Log(rules={"out": TopicLimits(max_message_bytes=200)})
    write(log, [b"b=" + b"x" * 300, b"a=1"])
    connector = LogConnector(log, exactly_once=True)
    engine = engine_over(connector, growing(), {"t": MemoryTable("t")})
    run(engine, connector, limit=10)
    assert engine.figures.refused_records == {("in", "MessageSizeTooLargeError"): 1}
    assert engine.figures.dead_letters["in"] == 1


@GUARANTEES
def test_one_refused_record_among_many_is_found_in_few_batches(exactly_once: bool) -> None:
    """A batch function can cost far more applied record by record (a join scans its index
    every batch): the checked pass goes in batches and narrows down only where refused."""
    calls = Counter[int]()
    [grow] = growing()

    def counted(batch: Batch) -> None:
        calls[sum(len(rs) for rs in batch.records.values())] += 1
        grow.process(batch)

    log = Log(rules={"out": TopicLimits(max_message_bytes=200)})
    values = [f"k{n % 50}={n}".encode() for n in range(1000)]
    values[637] = b"big=" + b"x" * 300
    write(log, values)
    connector = LogConnector(log, exactly_once)
    table = MemoryTable("t")
    pipeline = Pipeline(
        "grow", reads=("in",), writes=grow.writes, produces=grow.produces, process=counted
    )
    run(engine_over(connector, [pipeline], {"t": table}), connector, limit=1000)
    assert list(dead_letters(log)) == [values[637]]
    assert len(outputs(log)) == 999
    assert sum(calls.values()) < 60  # the first pass, then batches of up to 64
    assert calls[1] < 20


class CountingStore:
    """A table partition in a dict that counts its reads."""

    def __init__(self, values: dict[bytes, bytes]) -> None:
        self.values = values
        self.reads = 0

    def get(self, key: bytes) -> bytes | None:
        self.reads += 1
        return self.values.get(key)

    def items(self, start: bytes) -> Iterator[tuple[bytes, bytes]]:
        return iter(sorted((k, v) for k, v in self.values.items() if k >= start))


def test_a_value_read_again_after_a_refusal_is_not_decoded_again_and_shares_nothing() -> None:
    # A value at its limit refuses each record that would grow it: each is applied alone,
    # on a view of its own, and reads the value afresh.
    stored = {"store_id": "s", "on_hand": {f"sku-{n}": n for n in range(100)}, "tags": [[1]]}
    store = CountingStore({b"s": orjson.dumps(stored), b"other": b"1"})
    cycle = TableView("inventory", store, ordered=False)
    seen = []
    for attempt in range(4):
        batch = cycle.child()
        value = batch.get_fresh(b"s")
        assert value == stored
        seen.append(value)
        value["on_hand"][f"new-{attempt}"] = 1  # the record's effect, then refused
        value["tags"][0].append(attempt)
    assert store.reads == 2  # the first read, and the second that keeps it decoded
    assert all(a is not b for a, b in itertools.combinations(seen, 2))
    assert cycle.child().get_fresh(b"absent") is None
    assert cycle.child().get_fresh(b"absent") is None
    assert cycle.child().get_fresh(b"absent") is None


def test_a_fresh_copy_of_a_table_value_shares_nothing_mutable_with_it() -> None:
    value = {"a": {"b": [1, {"c": 2.5}], "d": None}, "e": ["x", True]}
    copied = fresh_copy(value)
    assert copied == value
    copied["a"]["b"][1]["c"] = 0
    copied["e"].append("y")
    assert value == {"a": {"b": [1, {"c": 2.5}], "d": None}, "e": ["x", True]}
    # anything but dicts, lists and JSON scalars is copied through its encoding
    assert fresh_copy({"pair": (1, 2)}) == {"pair": [1, 2]}
