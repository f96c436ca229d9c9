"""The engine (tables/engine.py) over an in-process log: what a cycle makes take effect,
poison records, crashes between Kafka and the store, refetches and lag past markers.

The log here keeps records and committed offsets the way a broker does for one consumer
group; a delivery that fails takes nothing (an aborted transaction), so a restart from
the log must give the same tables as a run without failures.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace

import orjson
import pytest

from agents import words
from agents.schemas import TEXT_LINES
from agents.words import WORD_COUNTS
from core.settings import Settings
from core.topics import POSITION_KEY, dlq_topic
from streams.compile import compile_topology, repartition_topic
from streams.corrections import corrections_pipeline
from streams.loading import load
from streams.testing import MemoryTable
from tables.engine import TP, Engine, StoreFailure
from tables.faust_adapter import StandbyFlusher
from tables.limits import BATCH_HEADER_BYTES, TopicLimits, record_batch_bytes
from tables.pipeline import ERROR_HEADER, Batch, Context, Output, Pipeline, Record, TableSpec
from tables.positions import Lineage, Position, encode_offsets
from tables.refusals import Failure, SendPlan, Undelivered
from tests.support.clock import Clock

PARTITIONS = 2
REPARTITION_TOPIC = repartition_topic("streamstate", WORD_COUNTS)


class MessageSizeTooLargeError(Exception):
    """As aiokafka names Kafka's refusal of a record batch larger than its topic takes."""


class InvalidTimestampError(Exception):
    """Kafka's refusal of a timestamp out of its topic's range."""


class UnknownError(Exception):
    """What aiokafka raises for Kafka's INVALID_RECORD (a compacted topic, no key)."""


class OutOfOrderSequenceNumber(Exception):
    """Kafka's answer to every batch a producer sends to a partition after a refused one."""


@dataclass
class Log:
    """Topic partitions of records and one group's committed offsets; ``rules`` are the
    topics' limits the log enforces on each record batch, as a broker does."""

    records: dict[TP, list[Record]] = field(default_factory=dict)
    committed: dict[TP, int] = field(default_factory=dict)
    rules: dict[str, TopicLimits] = field(default_factory=dict)

    def append(
        self,
        tp: TP,
        key: bytes | None,
        value: bytes | None,
        headers: object = (),
        timestamp: int | None = 0,
    ) -> int:
        records = self.records.setdefault(tp, [])
        offset = len(records)
        hdrs = tuple(headers or ())
        at = int(time.time() * 1000) if timestamp is None else timestamp
        records.append(Record(tp.topic, tp.partition, offset, key, value, at, hdrs))
        return offset

    def topic(self, topic: str) -> list[Record]:
        return [r for tp, rs in sorted(self.records.items()) if tp.topic == topic for r in rs]

    def refuses(self, topic: str, batch: Sequence[Output]) -> Exception | None:
        """What a broker answers to this record batch (None: it takes it)."""
        rules = self.rules.get(topic)
        if rules is None:
            return None
        size = BATCH_HEADER_BYTES + sum(
            record_batch_bytes(o.key, o.value, o.headers) - BATCH_HEADER_BYTES for o in batch
        )
        if size > rules.max_message_bytes:
            return MessageSizeTooLargeError(f"{size} bytes")
        now = int(time.time() * 1000)
        for out in batch:
            if out.key is None and rules.compacted:
                return UnknownError("compacted topic, no key")
            if out.timestamp_ms is not None and rules.time_refusal(out.timestamp_ms, now):
                return InvalidTimestampError(str(out.timestamp_ms))
        return None


def _batches(outputs: Sequence[Output], plan: SendPlan | None) -> list[tuple[TP, list[Output]]]:
    """Record batches as the real delivery makes them: per partition, in order, one record
    each for isolated partitions, no larger than the plan's size per topic."""
    grouped: dict[TP, list[Output]] = {}
    for out in outputs:
        tp = TP(out.topic, out.partition if out.partition is not None else 0)
        grouped.setdefault(tp, []).append(out)
    found = []
    for tp, records in grouped.items():
        alone = plan is not None and (tp.topic, tp.partition) in plan.isolate
        limit = plan.batch_bytes(tp.topic) if plan and plan.batch_bytes else 1 << 30
        batch: list[Output] = []
        size = BATCH_HEADER_BYTES
        for out in records:
            grow = record_batch_bytes(out.key, out.value, out.headers) - BATCH_HEADER_BYTES
            if batch and (alone or size + grow > limit):
                found.append((tp, batch))
                batch, size = [], BATCH_HEADER_BYTES
            batch.append(out)
            size += grow
        if batch:
            found.append((tp, batch))
    return found


@dataclass
class LogProducer:
    """A producer on the log. Like aiokafka's, it cannot send to a partition again after a
    refused batch there (``broken``) until it is replaced (:meth:`reset`). Inside a
    transaction its records reach the log, with the offsets, when it commits."""

    log: Log
    fail: list[bool]
    opened: int = 0
    broken: set[TP] = field(default_factory=set)
    resets: int = 0
    #: the open transaction's records and offsets (None: none open)
    pending: list[tuple[TP, Output]] | None = None
    offsets: dict[TP, int] = field(default_factory=dict)
    #: the topics of each send, in the order of their records
    sends: list[list[str]] = field(default_factory=list)

    async def open(self) -> None:
        self.opened += 1

    async def send(self, records: Sequence[Output], plan: SendPlan) -> dict[TP, int]:
        if self.fail and self.fail[0]:
            raise ConnectionError("the broker went away")
        self.sends.append(list(dict.fromkeys(out.topic for out in records)))
        batches = _batches(records, plan)
        failures, taken = [], []
        for tp, batch in batches:
            error = (
                OutOfOrderSequenceNumber()
                if tp in self.broken
                else self.log.refuses(tp.topic, batch)
            )
            if error is None:
                taken.append((tp, batch))
                continue
            self.broken.add(tp)
            failures.append(Failure((tp.topic, tp.partition), error, batch))
        written: dict[TP, int] = {}
        for tp, batch in taken:
            for out in batch:
                written[tp] = self._append(tp, out)
        if failures:
            raise Undelivered(failures, len(taken), [out for _, batch in taken for out in batch])
        return written

    def _append(self, tp: TP, out: Output) -> int:
        if self.pending is None:
            return self.log.append(tp, out.key, out.value, out.headers, out.timestamp_ms)
        self.pending.append((tp, out))
        return len(self.log.records.get(tp, ())) + sum(1 for t, _ in self.pending if t == tp) - 1

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        self.pending, self.offsets = [], {}
        try:
            yield
            for tp, out in self.pending:
                self.log.append(tp, out.key, out.value, out.headers, out.timestamp_ms)
            self.log.committed.update(self.offsets)
        finally:
            self.pending = None

    async def send_offsets(self, offsets: Mapping[TP, int]) -> None:
        self.offsets.update(offsets)

    async def reset(self) -> None:
        self.resets += 1
        self.broken.clear()

    async def close(self) -> None:
        self.broken.clear()


@dataclass
class LogConnector:
    """One worker's view of the log: every partition assigned and ready."""

    log: Log
    exactly_once: bool
    fail: list[bool] = field(default_factory=lambda: [False])
    positions: dict[TP, int] = field(default_factory=dict)
    commits: int = 0
    paused: set[TP] = field(default_factory=set)
    shared_broken: set[TP] = field(default_factory=set)
    #: the topics' limits as the broker describes them (None: the log's own rules)
    rules: dict[str, TopicLimits] | None = None
    limits_read: int = 0

    def ready(self, partition: int) -> bool:
        return True

    def assigned(self, partition: int, topics: frozenset[str]) -> list[TP]:
        return [TP(topic, partition) for topic in sorted(topics)]

    def producer(self, partition: int, *, transactional: bool) -> LogProducer:
        if transactional:  # a producer of its own
            return LogProducer(self.log, self.fail)
        # at_least_once: every task's view of one shared producer
        return LogProducer(self.log, self.fail, broken=self.shared_broken)

    async def committed(self, tps: Sequence[TP]) -> dict[TP, int | None]:
        return {tp: self.log.committed.get(tp) for tp in tps}

    async def seek(self, offsets: Mapping[TP, int | None]) -> None:
        for tp, offset in offsets.items():
            self.positions[tp] = offset or 0

    async def commit(self, offsets: Mapping[TP, int]) -> None:
        self.commits += 1
        self.log.committed.update(offsets)

    async def prepare(self) -> None:
        pass

    def pause(self, tps: Sequence[TP]) -> None:
        self.paused.update(tps)

    def resume(self, tps: Sequence[TP]) -> None:
        self.paused.difference_update(tps)

    async def limits(self, topics: Sequence[str]) -> dict[str, TopicLimits]:
        self.limits_read += 1
        known = self.rules if self.rules is not None else self.log.rules
        return {topic: known[topic] for topic in topics if topic in known}

    async def close(self) -> None:
        pass


def fetch(connector: LogConnector, topics: Sequence[str], limit: int) -> dict[TP, list[Record]]:
    """What a consumer fetches next: up to ``limit`` records per partition."""
    fetched = {}
    for tp, records in sorted(connector.log.records.items()):
        if tp.topic in topics and tp not in connector.paused:
            start = connector.positions.get(tp, 0)
            fetched[tp] = records[start : start + limit]
            connector.positions[tp] = start + len(fetched[tp])
    return fetched


def run(engine: Engine, connector: LogConnector, limit: int = 3, cycles: int = 100) -> None:
    """Fetch and process until nothing is left."""

    async def go() -> None:
        for _ in range(cycles):
            fetched = fetch(connector, sorted(engine.topics), limit)
            if not any(fetched.values()) and engine.tasks:
                return
            positions = {tp: connector.positions[tp] for tp in fetched}
            await engine.process(fetched, positions)

    asyncio.run(go())


async def offer_next(
    engine: Engine, connector: LogConnector, limit: int, *, settled: bool = True
) -> None:
    """One fetch handed to the engine as the worker's fetch loop hands it."""
    fetched = fetch(connector, sorted(engine.topics), limit)
    positions = {tp: connector.positions[tp] for tp in fetched}
    await engine.offer(fetched, positions, settled=settled)


def word_engine(connector: LogConnector, table: MemoryTable) -> Engine:
    return Engine(
        word_pipelines(),
        {WORD_COUNTS: table},
        connector,
        partitions=PARTITIONS,
        exactly_once=connector.exactly_once,
    )


def word_pipelines() -> list[Pipeline]:
    context = Context(PARTITIONS, max_event_bytes=1000, window_retention_ms=0)
    return compile_topology(words.pipelines(context), context).pipelines


def lines(log: Log, texts: Sequence[str]) -> Counter[bytes]:
    for n, text in enumerate(texts):
        log.append(TP(TEXT_LINES, n % PARTITIONS), None, text.encode())
    return Counter(word.encode() for text in texts for word in text.lower().split())


TEXTS = ["the fox", "The dog and the fox", "a b c", "ünïcode wörds", "b b b"] * 7


def words_at_partition_0(exactly_once: bool) -> tuple[Log, TP, LogConnector, Engine]:
    """The texts in a log, and a word count engine over it; partition 0 of the lines."""
    log = Log()
    lines(log, TEXTS)
    connector = LogConnector(log, exactly_once=exactly_once)
    return log, TP(TEXT_LINES, 0), connector, word_engine(connector, MemoryTable(WORD_COUNTS))


@pytest.mark.parametrize("exactly_once", [False, True])
def test_a_run_counts_every_word_once_and_commits_every_offset(exactly_once: bool) -> None:
    log, table = Log(), MemoryTable(WORD_COUNTS)
    want = lines(log, TEXTS)
    connector = LogConnector(log, exactly_once)
    run(word_engine(connector, table), connector)
    assert table.values() == dict(want)
    for tp, records in log.records.items():
        if tp.topic in (TEXT_LINES, REPARTITION_TOPIC):
            assert log.committed[tp] == len(records), tp
    assert (connector.commits > 0) is not exactly_once


def test_each_cycle_records_the_tasks_position_in_the_table_and_its_changelog() -> None:
    log, table = Log(), MemoryTable(WORD_COUNTS)
    lines(log, TEXTS)
    connector = LogConnector(log, exactly_once=True)
    run(word_engine(connector, table), connector)
    # every partition of text-lines reaches every word_counts partition
    text_ends = {str(p): len(log.records[TP(TEXT_LINES, p)]) for p in range(PARTITIONS)}
    for partition in range(PARTITIONS):
        stored = Position.decode(table.partitions[partition][POSITION_KEY])
        repartition = log.committed[TP(REPARTITION_TOPIC, partition)]
        assert encode_offsets(stored.applied) == orjson.dumps(
            {REPARTITION_TOPIC: {str(partition): repartition}, TEXT_LINES: text_ends}
        )
        assert encode_offsets(stored.upstream[REPARTITION_TOPIC]) == orjson.dumps(
            {TEXT_LINES: text_ends}
        )
        changelog = log.records[TP(table.changelog_topic, partition)]
        last_position = [r for r in changelog if r.key == POSITION_KEY][-1]
        assert last_position.value == table.partitions[partition][POSITION_KEY]
        # the store records the changelog offset it reaches
        assert table.offsets[partition] == changelog[-1].offset


def test_position_records_reach_no_batch_function_and_a_new_task_starts_from_them() -> None:
    log, table = Log(), MemoryTable(WORD_COUNTS)
    want = lines(log, TEXTS[:2])
    connector = LogConnector(log, exactly_once=True)
    run(word_engine(connector, table), connector)
    repartitioned = log.topic(REPARTITION_TOPIC)
    assert any(r.key == POSITION_KEY for r in repartitioned)
    assert table.values() == dict(want)  # no offsets counted as words
    before = {p: Position.decode(table.partitions[p][POSITION_KEY]) for p in range(PARTITIONS)}
    # A new worker on the same store: the upstream offsets come back from the table.
    restarted = LogConnector(log, exactly_once=True)
    engine = word_engine(restarted, table)
    run(engine, restarted)
    for partition, task in engine.tasks.items():
        assert task.upstream == before[partition].upstream


def test_the_lineage_names_each_tables_sources_and_how_they_reach_it() -> None:
    context = Context(PARTITIONS, max_event_bytes=1000, window_retention_ms=0)
    loaded = load(Settings().pipeline_modules, context)
    corrections = corrections_pipeline(loaded.tables)
    assert corrections is not None
    lineage = Lineage.of([*loaded.pipelines, corrections])
    assert lineage.sources("word_counts") == {"text-lines": "upstream", "corrections": "direct"}
    assert lineage.sources("inventory") == {"item-events": "direct", "corrections": "direct"}
    assert lineage.sources("sales_by_category") == {
        "item-events": "upstream",
        "corrections": "direct",
    }
    assert lineage.sources("unsettled_sales") == {
        "item-events": "direct",
        "payments": "direct",
        "corrections": "direct",
    }


def test_the_changelog_holds_the_tables_latest_values() -> None:
    log, table = Log(), MemoryTable(WORD_COUNTS)
    lines(log, TEXTS)
    connector = LogConnector(log, exactly_once=True)
    run(word_engine(connector, table), connector)
    latest: dict[bytes, object] = {}
    for record in log.topic(table.changelog_topic):
        if record.key != POSITION_KEY:
            assert record.key is not None
            assert record.value is not None
            latest[record.key] = orjson.loads(record.value)
    assert latest == table.values()


def boom_on(word: bytes):  # type: ignore[no-untyped-def]
    """A pipeline counting keys of ``in`` that raises on one of them."""

    def process(batch: Batch) -> None:
        table = batch.table("t")
        for record in batch.of("in"):
            if record.value == word:
                raise RuntimeError(f"cannot take {word!r}")
            assert record.value is not None
            table.put(record.value, (table.get(record.value) or 0) + 1)
            batch.send("out", record.value, b"seen", partition=record.partition)

    return Pipeline("boom", reads=("in",), writes=(TableSpec("t"),), process=process)


def test_a_record_that_raises_goes_to_its_dead_letter_topic_and_the_rest_take_effect() -> None:
    log, table = Log(), MemoryTable("t")
    for value in [b"a", b"b", b"poison", b"a", b"c"]:
        log.append(TP("in", 0), None, value)
    connector = LogConnector(log, exactly_once=True)
    engine = Engine(
        [boom_on(b"poison")],
        {"t": table},
        connector,
        partitions=PARTITIONS,
        exactly_once=connector.exactly_once,
    )
    run(engine, connector, limit=10)
    assert table.values() == {b"a": 2, b"b": 1, b"c": 1}
    assert [r.key for r in log.topic("out")] == [b"a", b"b", b"a", b"c"]
    [dead] = log.topic(dlq_topic("in"))
    headers = dict(dead.headers)
    assert dead.value == b"poison"
    assert headers[ERROR_HEADER] == b"processing failed: RuntimeError: cannot take b'poison'"
    assert headers["source-offset"] == b"2"
    assert headers["failed-pipeline"] == b"boom"  # the others reading "in" applied it
    assert log.committed[TP("in", 0)] == 5
    assert engine.figures.dead_letters["in"] == 1
    assert engine.figures.failed_records["boom"] == 1


def test_pipelines_reading_one_topic_parse_each_record_once_per_cycle() -> None:
    calls: Counter[bytes] = Counter()

    def parse(raw: bytes | None, limit: int) -> int:
        assert raw is not None
        calls[raw] += 1
        if raw == b"x":
            raise ValueError("not a number")
        return int(raw)

    def summing(name: str) -> Pipeline:
        def process(batch: Batch) -> None:
            table = batch.table(name)
            for n in batch.parsed("in", parse, 10):
                if not isinstance(n, Exception):
                    table.put(b"sum", (table.get(b"sum") or 0) + n)

        return Pipeline(name, reads=("in",), writes=(TableSpec(name),), process=process)

    log, first, second = Log(), MemoryTable("first"), MemoryTable("second")
    for value in [b"1", b"2", b"x", b"4"]:
        log.append(TP("in", 0), None, value)
    connector = LogConnector(log, exactly_once=True)
    tables = {"first": first, "second": second}
    engine = Engine(
        [summing("first"), summing("second")],
        tables,
        connector,
        partitions=PARTITIONS,
        exactly_once=connector.exactly_once,
    )
    run(engine, connector, limit=10)
    assert first.values() == second.values() == {b"sum": 7}
    assert calls == {b"1": 1, b"2": 1, b"x": 1, b"4": 1}


def test_records_applied_one_by_one_after_a_failure_each_get_their_own_parse() -> None:
    """After a record raises, the batch is applied record by record: each of those
    one-record batches must see its own record's parse, not one cached for another."""

    def parse(raw: bytes | None, limit: int) -> int:
        assert raw is not None
        return int(raw)

    def summing(batch: Batch) -> None:
        table = batch.table("t")
        for record, n in zip(batch.of("in"), batch.parsed("in", parse, 10), strict=True):
            if n == 13:
                raise RuntimeError("unlucky")
            assert not isinstance(n, Exception)
            table.put(record.value or b"", n)

    log, table = Log(), MemoryTable("t")
    values = [b"1", b"2", b"13", b"4", b"5", b"6"]
    for value in values:
        log.append(TP("in", 0), None, value)
    connector = LogConnector(log, exactly_once=True)
    pipeline = Pipeline("sum", reads=("in",), writes=(TableSpec("t"),), process=summing)
    engine = Engine(
        [pipeline],
        {"t": table},
        connector,
        partitions=PARTITIONS,
        exactly_once=connector.exactly_once,
    )
    run(engine, connector, limit=10)
    assert table.values() == {v: int(v) for v in values if v != b"13"}
    assert [r.value for r in log.topic(dlq_topic("in"))] == [b"13"]


def test_a_table_value_with_no_json_encoding_dead_letters_the_record_that_wrote_it() -> None:
    """A batch function's value that cannot be stored (a set) is refused as Kafka would
    refuse a record: the record that wrote it goes to its dead-letter topic, and the
    partition goes on."""

    def collecting(batch: Batch) -> None:
        table = batch.table("t")
        for record in batch.of("in"):
            value = (record.value or b"").decode()
            seen = table.get_fresh(b"all") or []
            table.put(b"all", {*seen, value} if value == "bad" else [*seen, value])

    log, table = Log(), MemoryTable("t")
    for value in (b"1", b"2", b"bad", b"4"):
        log.append(TP("in", 0), None, value)
    connector = LogConnector(log, exactly_once=True)
    pipeline = Pipeline("collect", reads=("in",), writes=(TableSpec("t"),), process=collecting)
    engine = Engine([pipeline], {"t": table}, connector, partitions=PARTITIONS, exactly_once=True)
    run(engine, connector, limit=10)
    assert table.values() == {b"all": ["1", "2", "4"]}
    [letter] = log.topic(dlq_topic("in"))
    assert letter.value == b"bad"
    reason = dict(letter.headers or ())[ERROR_HEADER].decode()
    assert reason == (
        "TableValueError: table t, key 'all': the value has no JSON encoding "
        "(Type is not JSON serializable: set)"
    )
    assert not engine.stalled()


@pytest.mark.parametrize("fail_at", [1, 2, 4, 7])
def test_a_kafka_failure_stops_the_cycle_and_a_restart_resumes_exactly(fail_at: int) -> None:
    log, table = Log(), MemoryTable(WORD_COUNTS)
    want = lines(log, TEXTS)
    connector = LogConnector(log, exactly_once=True)
    engine = word_engine(connector, table)

    async def until_failure() -> None:
        for cycle in range(fail_at + 1):
            connector.fail[0] = cycle == fail_at
            fetched = fetch(connector, sorted(engine.topics), 2)
            positions = {tp: connector.positions[tp] for tp in fetched}
            await engine.process(fetched, positions)

    asyncio.run(until_failure())
    stalled = engine.stalled()
    assert stalled, "a failed cycle shows"
    assert all("Kafka did not take the batch" in s["reason"] for s in stalled)
    # the failed cycle reached neither the log nor the store
    changelog_keys = {r.key for r in log.topic(table.changelog_topic)} - {POSITION_KEY}
    assert set(table.values()) == changelog_keys
    assert table.values() != dict(want)
    # A new worker process: the store as it was, everything else from the log.
    restarted = LogConnector(log, exactly_once=True)
    run(word_engine(restarted, table), restarted, limit=2)
    assert table.values() == dict(want)


def test_records_fetched_again_after_a_seek_are_not_applied_twice() -> None:
    log, table = Log(), MemoryTable(WORD_COUNTS)
    want = lines(log, TEXTS)
    connector = LogConnector(log, exactly_once=False)
    engine = word_engine(connector, table)
    run(engine, connector, limit=4)

    async def refetch() -> None:
        for tp in list(connector.positions):
            connector.positions[tp] = 0
        fetched = fetch(connector, sorted(engine.topics), 1000)
        await engine.process(fetched, {tp: connector.positions[tp] for tp in fetched})

    asyncio.run(refetch())
    assert table.values() == dict(want)


def test_a_partition_with_only_transaction_markers_left_commits_past_them() -> None:
    log, table = Log(), MemoryTable(WORD_COUNTS)
    lines(log, TEXTS)
    connector = LogConnector(log, exactly_once=True)
    engine = word_engine(connector, table)
    run(engine, connector)
    tp = TP(TEXT_LINES, 0)
    end = len(log.records[tp])
    assert log.committed[tp] == end

    async def marker_only() -> None:
        # the consumer skipped a control record: its position moved, no record came
        await engine.process({}, {tp: end + 1})

    asyncio.run(marker_only())
    assert log.committed[tp] == end + 1
    assert engine.lag({tp: end + 1})[tp] == 0


def test_a_task_starts_from_the_committed_offsets_and_drops_what_was_fetched_before() -> None:
    log, table = Log(), MemoryTable(WORD_COUNTS)
    lines(log, TEXTS)
    tp = TP(TEXT_LINES, 0)
    log.committed[tp] = 4
    connector = LogConnector(log, exactly_once=True)
    engine = word_engine(connector, table)

    async def first() -> None:
        fetched = {tp: log.records[tp][:2]}
        await engine.process(fetched, {tp: 2})

    asyncio.run(first())
    assert set(engine.tasks) == {0}
    assert engine.tasks[0].checkpoint.next[tp] == 4
    assert connector.positions[tp] == 4
    assert table.values() == {}  # the fetched records were dropped, not applied


@pytest.mark.parametrize(
    ("began", "runs_now"), [(2, True), (1, False), (None, False)], ids=["on", "before", "unknown"]
)
def test_a_starting_task_runs_what_was_fetched_when_it_follows_on_from_the_committed_offsets(
    began: int | None, runs_now: bool
) -> None:
    # The fetch loop says where each fetched partition's records follow on from; records
    # that follow on from the committed offset run in the cycle that starts the task, the
    # partition left where it is. Others are dropped and fetched again from there.
    log, tp, connector, engine = words_at_partition_0(exactly_once=True)
    log.committed[tp] = 2
    connector.positions[tp] = 5  # past the records fetched
    starts = {} if began is None else {tp: began}

    async def first() -> None:
        await engine.process({tp: log.records[tp][2:5]}, {tp: 5}, starts)

    asyncio.run(first())
    assert set(engine.tasks) == {0}
    if runs_now:
        assert engine.figures.cycles == 1
        assert engine.tasks[0].checkpoint.next[tp] == 5
        assert log.committed[tp] == 5
        assert connector.positions[tp] == 5  # not sought: the consumer keeps its place
    else:
        assert engine.figures.cycles == 0
        assert engine.tasks[0].checkpoint.next[tp] == 2
        assert log.committed[tp] == 2
        assert connector.positions[tp] == 2  # sought back to the committed offset


def test_the_first_assignment_reads_the_topics_limits_before_the_first_task_starts() -> None:
    log, tp, connector, engine = words_at_partition_0(exactly_once=False)

    async def assign_then_start() -> tuple[int, bool]:
        await engine.keep({0})
        await asyncio.sleep(0)
        read_at_assignment = connector.limits_read, engine.limits.read
        await engine.process({tp: log.records[tp][:2]}, {tp: 2})
        return read_at_assignment

    assert asyncio.run(assign_then_start()) == (1, True)
    assert set(engine.tasks) == {0}
    assert connector.limits_read == 1  # the task's start did not read them again


def test_the_first_cycle_after_each_assignment_says_how_long_it_waited(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log, tp, _, engine = words_at_partition_0(exactly_once=False)
    caplog.set_level(logging.INFO, logger="tables.engine")

    async def two_assignments() -> None:
        for start in (0, 2):
            await engine.keep({0})
            await engine.process({tp: log.records[tp][start : start + 1]}, {tp: start + 1})
            await engine.process({tp: log.records[tp][start + 1 : start + 2]}, {tp: start + 2})

    asyncio.run(two_assignments())
    firsts = [r.getMessage() for r in caplog.records if "after the assignment" in r.getMessage()]
    assert len(firsts) == 2, firsts  # one per assignment, not one per cycle
    assert all(m.startswith("first cycle after the assignment: 1 records of 1 ") for m in firsts)


def test_pipelines_must_declare_the_tables_they_write() -> None:
    connector = LogConnector(Log(), exactly_once=True)
    with pytest.raises(ValueError, match="undeclared tables"):
        Engine(
            [boom_on(b"x")],
            {},
            connector,
            partitions=PARTITIONS,
            exactly_once=connector.exactly_once,
        )


def test_a_store_that_fails_after_kafka_took_the_cycle_is_a_store_failure() -> None:
    class FullDisk(MemoryTable):
        def apply(
            self,
            partition: int,
            changes: Mapping[bytes, bytes | None],
            changelog_offset: int | None,
        ) -> None:
            raise OSError(28, "No space left on device")

    log, table = Log(), FullDisk(WORD_COUNTS)
    lines(log, TEXTS[:3])
    connector = LogConnector(log, exactly_once=True)
    with pytest.raises(StoreFailure, match="No space left on device"):
        run(word_engine(connector, table), connector)
    # Kafka has the cycle (its changelog records and offsets): a restore brings it back
    assert log.topic(table.changelog_topic)


def test_a_kafka_failure_is_not_a_store_failure() -> None:
    log, table = Log(), MemoryTable(WORD_COUNTS)
    lines(log, TEXTS[:3])
    connector = LogConnector(log, exactly_once=True, fail=[True])
    engine = word_engine(connector, table)
    epoch = engine.stores_epoch()
    run(engine, connector)
    assert engine.failure is None  # it is tried again; a store failure stops for good
    # A failed transaction may have committed all the same: the stores may be behind.
    assert engine.stores_epoch() != epoch
    assert set(engine.stalls) == set(range(PARTITIONS))
    assert not log.topic(table.changelog_topic)


@pytest.mark.parametrize("exactly_once", [True, False])
def test_the_stores_epoch_stays_while_every_cycle_commits(exactly_once: bool) -> None:
    log, table = Log(), MemoryTable(WORD_COUNTS)
    lines(log, TEXTS[:3])
    connector = LogConnector(log, exactly_once=exactly_once)
    engine = word_engine(connector, table)
    epoch = engine.stores_epoch()
    run(engine, connector)
    assert log.topic(table.changelog_topic)  # the cycles took effect
    assert engine.stores_epoch() == epoch == (0 if exactly_once else None)


def test_a_failed_engine_keeps_the_first_reason() -> None:
    connector = LogConnector(Log(), exactly_once=True)
    engine = word_engine(connector, MemoryTable(WORD_COUNTS))
    assert engine.failure is None
    epoch = engine.stores_epoch()
    engine.fail("task 1: the store failed: disk full")
    assert engine.stores_epoch() != epoch
    engine.fail("a standby's store failed: disk full")
    assert engine.failure == "task 1: the store failed: disk full"


class _Recovery:
    def __init__(self, error: Exception | None) -> None:
        self.error, self.flushes = error, 0

    def flush_buffers(self) -> None:
        self.flushes += 1
        if self.error is not None:
            raise self.error


@pytest.mark.parametrize("error", [None, OSError("No space left on device")])
def test_the_standby_flusher_fails_the_engine_when_a_standby_store_fails(
    error: Exception | None,
) -> None:
    engine = word_engine(LogConnector(Log(), exactly_once=True), MemoryTable(WORD_COUNTS))
    recovery = _Recovery(error)
    flusher = StandbyFlusher(
        SimpleNamespace(tables=SimpleNamespace(recovery=recovery)), engine, 0.5
    )
    flusher.flush()
    assert recovery.flushes == 1
    if error is None:
        assert engine.failure is None
    else:
        assert engine.failure is not None
        assert "No space left on device" in engine.failure
        flusher.flush()  # a failed engine flushes no more
        assert recovery.flushes == 1


@dataclass
class RestoringConnector(LogConnector):
    """A worker whose tables are still restoring for each partition's first fetch."""

    asked: set[int] = field(default_factory=set)

    def ready(self, partition: int) -> bool:
        first = partition not in self.asked
        self.asked.add(partition)
        return not first


@pytest.mark.parametrize("exactly_once", [False, True])
def test_records_fetched_before_a_partition_is_restored_are_fetched_again(
    exactly_once: bool,
) -> None:
    # Nothing more arrives after these records: dropped, they would never be applied.
    log, table = Log(), MemoryTable(WORD_COUNTS)
    want = lines(log, TEXTS)
    connector = RestoringConnector(log, exactly_once)
    run(word_engine(connector, table), connector, limit=100)
    assert connector.asked == set(range(PARTITIONS))
    assert table.values() == dict(want)
    for tp, records in log.records.items():
        if tp.topic in (TEXT_LINES, REPARTITION_TOPIC):
            assert log.committed[tp] == len(records), tp


@pytest.mark.parametrize("exactly_once", [False, True])
def test_records_fetched_during_a_rebalance_are_fetched_again(exactly_once: bool) -> None:
    # The consumer's position is past them, and nothing more arrives to start the tasks.
    log, table = Log(), MemoryTable(WORD_COUNTS)
    want = lines(log, TEXTS)
    connector = LogConnector(log, exactly_once)
    engine = word_engine(connector, table)

    asyncio.run(offer_next(engine, connector, 1000, settled=False))
    assert engine.tasks == {}
    assert table.values() == {}
    run(engine, connector, limit=1000)
    assert table.values() == dict(want)


@pytest.mark.parametrize("exactly_once", [False, True])
def test_after_a_kafka_failure_the_same_engine_applies_the_failed_batch(
    exactly_once: bool, clock: Clock
) -> None:
    # One batch holds every record, so no later record would start the tasks again.
    log, table = Log(), MemoryTable(WORD_COUNTS)
    want = lines(log, TEXTS)
    connector = LogConnector(log, exactly_once, fail=[True])
    engine = word_engine(connector, table)

    async def until_stalled() -> None:
        while not engine.stalls:
            await offer_next(engine, connector, 1000)

    asyncio.run(until_stalled())
    assert engine.tasks == {}
    assert connector.paused  # nothing is fetched for the stalled partitions meanwhile
    connector.fail[0] = False  # Kafka answers again
    clock.advance(60)
    asyncio.run(engine.tick())
    assert not connector.paused
    run(engine, connector, limit=1000)
    assert table.values() == dict(want)
    assert engine.stalled() == []


def test_next_cycle_ends_with_the_first_cycle_that_runs_a_task_not_with_a_task_start() -> None:
    # The standby start after a rebalance waits for it (tables/faust_adapter.py).
    log, tp, connector, engine = words_at_partition_0(exactly_once=False)

    async def cycles() -> tuple[bool, bool, int]:
        waiting = asyncio.ensure_future(engine.next_cycle())
        await asyncio.sleep(0)
        # the partition's first records start its task and are fetched again: no run
        await engine.process({tp: log.records[tp][:2]}, {tp: 2})
        after_start = waiting.done()
        fetched = fetch(connector, [TEXT_LINES], 1000)
        await engine.process(fetched, {t: connector.positions[t] for t in fetched})
        await asyncio.sleep(0)
        return after_start, waiting.done(), engine.figures.cycles

    after_start, after_run, ran = asyncio.run(cycles())
    assert not after_start
    assert after_run
    assert ran == 1
