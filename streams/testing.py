"""The test driver: a pipeline run in process, on the engine that runs it in a worker,
over an in-memory log instead of Kafka.

    driver = TestDriver(topology, partitions=4)
    driver.produce("lines", "the quick brown fox")
    driver.run()
    assert driver.table("counts")["fox"] == 1

Records go to the partition Kafka's default partitioner would give their key (round
robin without a key); repartition records go where the pipelines send them, and each
cycle fetches up to ``fetch_records`` records of every partition, as a consumer does.
The log keeps one consumer group's committed offsets and every table's changelog, so a
crash at a named point of a cycle (:meth:`TestDriver.crash`) followed by
:meth:`TestDriver.restart` restores the tables from their changelogs and resumes from the
committed offsets, as a worker started again on the same disk does.

Event time is in the records; the wall clock, which window retention is measured
against, is the driver's (:meth:`TestDriver.advance`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Literal

import orjson
from sortedcontainers import SortedDict

from core.topics import POSITION_KEY, dlq_topic, partition_for
from core.values import to_json
from streams.compile import compile_all
from streams.loading import collect, declared_by, flatten
from streams.topology import Topology
from tables.engine import TP, Engine
from tables.global_table import MemoryGlobalTable
from tables.limits import TopicLimits
from tables.pipeline import ERROR_HEADER, Context, Output, Pipeline, Record
from tables.refusals import SendPlan
from tables.windows import AnyWindow, parse_window_range, window_end_ms

#: Where a cycle can crash: before Kafka takes anything; when Kafka has taken half of
#: the records of a send (at_least_once: no transaction takes them back; the outputs
#: go first, then the changelog records); after Kafka took the cycle, before the store
#: has it; after the store has it, before the offsets are committed (at_least_once:
#: they are committed apart).
CrashPoint = Literal["before_kafka", "halfway_into_kafka", "before_the_store", "before_the_commit"]
CRASH_POINTS: tuple[CrashPoint, ...] = (
    "before_kafka",
    "halfway_into_kafka",
    "before_the_store",
    "before_the_commit",
)
DAY_MS = 86_400_000


class Crash(BaseException):
    """The process died at a crash point (:meth:`TestDriver.crash`); no handler of the
    engine's takes it for a failure it could retry."""


# -- the log ------------------------------------------------------------------------------


@dataclass
class Log:
    """Topic partitions of records, and one consumer group's committed offsets."""

    records: dict[TP, list[Record]] = field(default_factory=dict)
    committed: dict[TP, int] = field(default_factory=dict)

    def append(
        self,
        tp: TP,
        key: bytes | None,
        value: bytes | None,
        headers: Iterable[tuple[str, bytes]] | None = (),
        timestamp: int = 0,
    ) -> int:
        records = self.records.setdefault(tp, [])
        offset = len(records)
        records.append(
            Record(tp.topic, tp.partition, offset, key, value, timestamp, tuple(headers or ()))
        )
        return offset

    def topic(self, topic: str) -> list[Record]:
        """Every record of a topic, partition by partition."""
        return [r for tp, rs in sorted(self.records.items()) if tp.topic == topic for r in rs]


@dataclass
class LogProducer:
    """A task's producer on the log. Inside a transaction its records are held back and
    reach the log, with the offsets, when the transaction commits; an aborted one leaves
    nothing."""

    log: Log
    partition_count: int = 1
    clock: Callable[[], int] = lambda: 0
    crash: Callable[[str], bool] = lambda point: False
    opened: int = 0
    #: the open transaction's records and offsets (None: none open)
    _pending: list[tuple[TP, Output]] | None = field(default=None, init=False)
    _offsets: dict[TP, int] = field(default_factory=dict, init=False)

    async def open(self) -> None:
        self.opened += 1

    async def send(self, records: Sequence[Output], plan: SendPlan) -> dict[TP, int]:
        if self.crash("before_kafka"):
            raise Crash("before_kafka")
        if self.crash("halfway_into_kafka"):
            # Under exactly-once the half goes into the open transaction, which the
            # crash aborts: nothing of it is read.
            self._append(records[: len(records) // 2])
            raise Crash("halfway_into_kafka")
        return self._append(records)

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        self._pending, self._offsets = [], {}
        try:
            yield
            for tp, out in self._pending:
                stamp = out.timestamp_ms if out.timestamp_ms is not None else self.clock()
                self.log.append(tp, out.key, out.value, out.headers, stamp)
            self.log.committed.update(self._offsets)
        finally:
            self._pending = None

    async def send_offsets(self, offsets: Mapping[TP, int]) -> None:
        self._offsets.update(offsets)

    def _append(self, outputs: Sequence[Output]) -> dict[TP, int]:
        written: dict[TP, int] = {}
        held = Counter(tp for tp, _ in self._pending or ())
        for out in outputs:
            partition = out.partition
            if partition is None:
                partition = 0 if out.key is None else partition_for(out.key, self.partition_count)
            tp = TP(out.topic, partition)
            if self._pending is not None:
                self._pending.append((tp, out))
                written[tp] = len(self.log.records.get(tp, ())) + held[tp]
                held[tp] += 1
                continue
            stamp = out.timestamp_ms if out.timestamp_ms is not None else self.clock()
            written[tp] = self.log.append(tp, out.key, out.value, out.headers, stamp)
        return written

    async def reset(self) -> None:
        pass

    async def close(self) -> None:
        pass


class MemoryPartition:
    """One partition of a :class:`MemoryTable` as the engine reads it."""

    def __init__(self, data: SortedDict) -> None:
        self.data = data

    def get(self, key: bytes) -> bytes | None:
        return None if key == POSITION_KEY else self.data.get(key)

    def items(self, start: bytes) -> Iterator[tuple[bytes, bytes]]:
        for key in self.data.irange(minimum=start):
            if key != POSITION_KEY:
                yield key, self.data[key]


@dataclass
class MemoryTable:
    """A table's store in memory: per partition, sorted keys and the changelog offset
    it holds."""

    name: str
    app_id: str = "streamstate"
    partitions: dict[int, SortedDict] = field(default_factory=dict)
    offsets: dict[int, int | None] = field(default_factory=dict)
    crash: Callable[[str], bool] = lambda point: False

    @property
    def changelog_topic(self) -> str:
        return f"{self.app_id}-{self.name}-changelog"

    def partition(self, partition: int) -> MemoryPartition:
        return MemoryPartition(self.partitions.setdefault(partition, SortedDict()))

    def apply(
        self, partition: int, changes: Mapping[bytes, bytes | None], changelog_offset: int | None
    ) -> None:
        if self.crash("before_the_store"):
            raise Crash("before_the_store")
        self.write(partition, changes, changelog_offset)

    def write(
        self, partition: int, changes: Mapping[bytes, bytes | None], changelog_offset: int | None
    ) -> None:
        data = self.partitions.setdefault(partition, SortedDict())
        for key, value in changes.items():
            if value is None:
                data.pop(key, None)
            else:
                data[key] = value
        self.offsets[partition] = changelog_offset

    def position(self, partition: int) -> bytes | None:
        found: bytes | None = self.partitions.get(partition, SortedDict()).get(POSITION_KEY)
        return found

    def items(self) -> Iterator[tuple[bytes, Any]]:
        """Every key and decoded value, partition by partition."""
        for _partition, data in sorted(self.partitions.items()):
            for key, value in data.items():
                if key != POSITION_KEY:
                    yield key, orjson.loads(value)

    def values(self) -> dict[bytes, Any]:
        """Every key and decoded value."""
        return dict(self.items())

    def restore(self, log: Log) -> None:
        """faust's recovery: each partition reads its changelog past the offset it holds."""
        for tp, records in sorted(log.records.items()):
            if tp.topic != self.changelog_topic:
                continue
            done = self.offsets.get(tp.partition)
            tail = [r for r in records if done is None or r.offset > done]
            if tail:
                self.write(tp.partition, {r.key: r.value for r in tail if r.key}, tail[-1].offset)


@dataclass
class LogConnector:
    """One worker holding every partition, over the log."""

    log: Log
    partition_count: int = 1
    clock: Callable[[], int] = lambda: 0
    crash: Callable[[str], bool] = lambda point: False
    positions: dict[TP, int] = field(default_factory=dict)
    commits: int = 0
    prepared: Callable[[], None] = lambda: None
    paused: set[TP] = field(default_factory=set)

    def ready(self, partition: int) -> bool:
        return True

    def assigned(self, partition: int, topics: frozenset[str]) -> list[TP]:
        return [TP(topic, partition) for topic in sorted(topics)]

    def producer(self, partition: int, *, transactional: bool) -> LogProducer:
        return LogProducer(self.log, self.partition_count, self.clock, self.crash)

    async def committed(self, tps: Sequence[TP]) -> dict[TP, int | None]:
        return {tp: self.log.committed.get(tp) for tp in tps}

    async def seek(self, offsets: Mapping[TP, int | None]) -> None:
        for tp, offset in offsets.items():
            self.positions[tp] = offset or 0

    async def commit(self, offsets: Mapping[TP, int]) -> None:
        if self.crash("before_the_commit"):
            raise Crash("before_the_commit")
        self.commits += 1
        self.log.committed.update(offsets)

    async def prepare(self) -> None:
        self.prepared()

    def pause(self, tps: Sequence[TP]) -> None:
        self.paused.update(tps)

    def resume(self, tps: Sequence[TP]) -> None:
        self.paused.difference_update(tps)

    async def limits(self, topics: Sequence[str]) -> dict[str, TopicLimits]:
        """The log refuses no record: no topic has limits."""
        return {}

    async def close(self) -> None:
        pass

    def fetch(self, topics: Iterable[str], limit: int) -> dict[TP, list[Record]]:
        """What a consumer fetches next: up to ``limit`` records per partition."""
        wanted = set(topics)
        fetched = {}
        for tp, records in sorted(self.log.records.items()):
            if tp.topic in wanted and tp not in self.paused:
                start = self.positions.get(tp, 0)
                batch = records[start : start + limit]
                if batch:
                    fetched[tp] = batch
                    self.positions[tp] = start + len(batch)
        return fetched


# -- the driver -----------------------------------------------------------------------------


@dataclass(frozen=True)
class OutputRecord:
    """A record a pipeline wrote to a topic."""

    key: bytes | None
    value: bytes | None
    partition: int
    offset: int
    timestamp: int
    headers: tuple[tuple[str, bytes], ...] = ()

    def json(self) -> Any:
        return None if self.value is None else orjson.loads(self.value)


@dataclass(frozen=True)
class DeadLetter:
    """A record sent to its topic's dead-letter topic, with the reason."""

    key: bytes | None
    value: bytes | None
    reason: str
    source_partition: int
    source_offset: int


Declared = Topology | Pipeline | ModuleType | str | Callable[[Context], Any]


class TestDriver:
    """Pipelines run in process (see the module's docstring).

    ``declared``: topologies, pipelines, pipeline modules (or their names) or
    ``pipelines(context)`` functions. ``partitions``: of every topic. ``exactly_once``:
    the guarantee the engine runs under. ``now_ms``: the wall clock at the start, which
    window retention is measured against and records produced without a timestamp take.
    ``fetch_records``: the most records of each partition a cycle takes.
    """

    __test__ = False  # not a pytest class

    def __init__(
        self,
        *declared: Declared,
        partitions: int = 4,
        exactly_once: bool = True,
        max_event_bytes: int = 64 * 1024,
        window_retention_ms: int = 7 * DAY_MS,
        now_ms: int = 1_700_000_000_000,
        fetch_records: int = 1000,
        app_id: str = "streamstate",
    ) -> None:
        self.partitions = partitions
        self.exactly_once = exactly_once
        self.fetch_records = fetch_records
        self.now_ms = now_ms
        self.log = Log()
        self.globals: dict[str, MemoryGlobalTable] = {}
        self.context = Context(
            partitions=partitions,
            max_event_bytes=max_event_bytes,
            window_retention_ms=window_retention_ms,
            app_id=app_id,
            clock=lambda: self.now_ms / 1000,
            global_tables=self.globals,
        )
        items: list[Any] = []
        for item in declared:
            items.extend(_declarations(item, self.context))
        self.loaded = collect(*compile_all(items, self.context))
        self.pipelines = self.loaded.pipelines
        for name, global_spec in self.loaded.globals.items():
            self.globals[name] = MemoryGlobalTable(global_spec, max_event_bytes)
        self.specs = self.loaded.tables
        self.tables = {name: MemoryTable(name, app_id, crash=self._crashes) for name in self.specs}
        self._round_robin: dict[str, Iterator[int]] = {}
        self._crash_at: tuple[str, int] | None = None
        self._cycle = 0
        self.engine = self._engine()

    # -- input ---------------------------------------------------------------------------

    def produce(
        self,
        topic: str,
        value: Any,
        *,
        key: str | bytes | None = None,
        timestamp: int | None = None,
        partition: int | None = None,
        headers: Iterable[tuple[str, bytes]] = (),
    ) -> tuple[int, int]:
        """Append one record to ``topic``; returns (partition, offset). ``value``: bytes
        as they are, text as UTF-8, anything else as JSON; None is a null value. Without a
        key, a record of a topic keyed by a field of its values takes that field's value
        as its key (as the produce endpoint does)."""
        spec = self.loaded.sources.get(topic)
        if key is None and spec is not None and spec.key and isinstance(value, dict):
            found = value.get(spec.key)
            key = None if found is None else str(found)
        raw_key = key.encode("utf-8") if isinstance(key, str) else key
        raw = _value_bytes(value)
        if partition is None:
            if raw_key is not None:
                partition = partition_for(raw_key, self.partitions)
            else:
                cycle = self._round_robin.setdefault(topic, itertools.cycle(range(self.partitions)))
                partition = next(cycle)
        stamp = self.now_ms if timestamp is None else timestamp
        offset = self.log.append(TP(topic, partition), raw_key, raw, headers, stamp)
        for table in self.globals.values():
            if table.spec.topic == topic:
                table.apply(raw_key, raw, stamp, offset)
        return partition, offset

    def produce_many(self, topic: str, records: Iterable[Any], **options: Any) -> None:
        """:meth:`produce` each record: a value, or a (key, value) pair."""
        for record in records:
            if isinstance(record, tuple):
                self.produce(topic, record[1], key=record[0], **options)
            else:
                self.produce(topic, record, **options)

    def advance(self, ms: int) -> None:
        """Move the wall clock on (window retention is measured against it)."""
        self.now_ms += ms

    # -- running -------------------------------------------------------------------------

    def run(self, max_cycles: int = 100_000) -> int:
        """Cycles until every record of every topic the pipelines read is processed;
        returns how many ran. :class:`Crash` at an armed crash point."""
        return asyncio.run(self._run(max_cycles))

    async def _run(self, max_cycles: int) -> int:
        connector = self.connector
        cycles = 0
        idle = 0
        while cycles < max_cycles:
            fetched = connector.fetch(self.engine.topics, self.fetch_records)
            if not fetched:
                idle += 1
                if idle > 1 or self.engine.tasks:
                    return cycles
                continue
            idle = 0
            positions = {tp: connector.positions[tp] for tp in fetched}
            self._cycle += 1
            cycles += 1
            await self.engine.process(fetched, positions)
        raise RuntimeError(f"the pipelines did not finish within {max_cycles} cycles")

    def crash(self, at: CrashPoint, *, cycle: int = 1) -> None:
        """Arm a crash at point ``at`` of the ``cycle``-th cycle from now that reaches it:
        :meth:`run` then raises :class:`Crash`, and :meth:`restart` starts again."""
        if at not in CRASH_POINTS:
            raise ValueError(f"crash point {at!r}: one of {', '.join(CRASH_POINTS)}")
        if at == "before_the_commit" and self.exactly_once:
            raise ValueError(
                "before_the_commit: under exactly_once the offsets commit with the cycle"
            )
        self._crash_at = (at, self._cycle + cycle)

    def _crashes(self, point: str) -> bool:
        if self._crash_at is None or self._crash_at[0] != point or self._cycle < self._crash_at[1]:
            return False
        self._crash_at = None
        return True

    def restart(self) -> None:
        """A new process on the same disk: the tables restored from their changelogs,
        the tasks started again from the committed offsets."""
        for table in self.tables.values():
            table.restore(self.log)
        self.engine = self._engine()

    def _engine(self) -> Engine:
        def clock() -> int:
            return self.now_ms

        self.connector = LogConnector(self.log, self.partitions, clock, self._crashes)
        return Engine(
            self.pipelines,
            self.tables,
            self.connector,
            partitions=self.partitions,
            exactly_once=self.exactly_once,
        )

    # -- output --------------------------------------------------------------------------

    def table(self, name: str) -> dict[Any, Any]:
        """A table's contents: key (text) to value; for a windowed table, (key, window
        start ms) to value. A key that is not UTF-8 (the index of a stream join) stays
        bytes."""
        spec = self.specs[name]
        found: dict[Any, Any] = {}
        for key, value in self.tables[name].items():
            if spec.window is None:
                try:
                    found[key.decode("utf-8")] = value
                except UnicodeDecodeError:
                    found[key] = value
            else:
                window = parse_window_range(key)
                assert window is not None
                if not self._expired(spec.window, window[1], window[2]):
                    found[(window[0], window[1])] = value
        return found

    def _expired(self, window: AnyWindow, start_ms: int, end_s: float) -> bool:
        """Whether a window is past its retention by the driver's clock: not read, as
        the worker serves none, though stored until its partition's next write."""
        retention = window.retention_ms
        if retention is None:
            retention = self.context.window_retention_ms
        return window_end_ms(window, start_ms, end_s) <= self.now_ms - retention

    def windows(self, name: str, key: str) -> list[dict[str, Any]]:
        """A windowed table's windows of ``key``: start, end (exclusive, ms), value."""
        spec = self.specs[name]
        assert spec.window is not None, f"{name} is not windowed"
        found = []
        for raw, value in self.tables[name].items():
            window = parse_window_range(raw)
            if window is not None and window[0] == key:
                if self._expired(spec.window, window[1], window[2]):
                    continue
                end = window_end_ms(spec.window, window[1], window[2])
                found.append({"start": window[1], "end": end, "value": value})
        return sorted(found, key=lambda w: w["start"])

    def outputs(self, topic: str) -> list[OutputRecord]:
        """What the pipelines wrote to ``topic``, partition by partition."""
        return [
            OutputRecord(r.key, r.value, r.partition, r.offset, r.timestamp, r.headers)
            for r in self.log.topic(topic)
            if r.key != POSITION_KEY
        ]

    def dead_letters(self, topic: str) -> list[DeadLetter]:
        """The records of ``topic`` sent to its dead-letter topic, with the reasons."""
        found = []
        for record in self.log.topic(dlq_topic(topic)):
            headers = dict(record.headers)
            found.append(
                DeadLetter(
                    record.key,
                    record.value,
                    headers.get(ERROR_HEADER, b"").decode("utf-8"),
                    int(headers.get("source-partition", b"-1")),
                    int(headers.get("source-offset", b"-1")),
                )
            )
        return found

    def lag(self) -> int:
        """Records of the topics the pipelines read that are not committed yet."""
        total = 0
        for tp, records in self.log.records.items():
            if tp.topic in self.engine.topics:
                total += len(records) - self.log.committed.get(tp, 0)
        return total


def _declarations(item: Declared, context: Context) -> list[Any]:
    if isinstance(item, str):
        return declared_by(item, context)
    if isinstance(item, ModuleType):
        return declared_by(item.__name__, context)
    if isinstance(item, Topology | Pipeline):
        return [item]
    if callable(item):
        return flatten(item(context))
    raise TypeError(f"cannot run {item!r}: a Topology, a Pipeline or a pipeline module")


def _value_bytes(value: Any) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    return to_json(value)
