"""Read positions: how far a copy of a table partition goes, in offsets of the source
topics, and how far it is behind its inputs.

A copy's :class:`~tables.positions.Position` is stored in the partition itself (the
engine writes it with every cycle; a standby gets it from the changelog). From it a read
answers ``applied`` (per source topic partition that feeds the table partition, the first
offset whose effect the copy does not hold), ``lag_records`` (records of the partition's
inputs it has not applied) and ``lag_ms`` (the age of the oldest of them).

Input end offsets come from :class:`InputEnds`, which asks the brokers every
``interval`` seconds; ``lag_ms`` is the time since an end offset past the copy's position
was first seen, so it is as fine as that interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from api.background import pause, stopped
from tables.positions import Lineage, Position

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class ReadPosition:
    """The ``position`` of a read's answer."""

    partition: int
    applied: dict[str, dict[int, int]]
    lag_records: int | None
    lag_ms: int | None
    #: ``applied`` as answers show it, when already made (shared: never changed)
    shown: dict[str, dict[str, int]] | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "partition": self.partition,
            "applied": shown_applied(self.applied) if self.shown is None else self.shown,
            "lag_records": self.lag_records,
            "lag_ms": self.lag_ms,
        }

    def holds(self, topic: str, wanted: Mapping[int, int]) -> bool:
        """Whether the copy holds every offset below ``wanted`` of ``topic``'s partitions."""
        have = self.applied.get(topic, {})
        return all(have.get(p, 0) >= offset for p, offset in wanted.items())


def shown_applied(applied: Mapping[str, Mapping[int, int]]) -> dict[str, dict[str, int]]:
    """Applied offsets as answers show them: partitions as strings, in order."""
    return {t: {str(p): o for p, o in sorted(ps.items())} for t, ps in applied.items()}


class InputEnds:
    """End offsets of the partitions the tables read, refreshed in the background, with a
    short history for the age of what a copy has not applied."""

    def __init__(
        self,
        bootstrap: str,
        topics: Iterable[str],
        partitions: int,
        *,
        read_committed: bool,
        interval: float = 0.5,
        history: int = 240,
    ) -> None:
        self.bootstrap = bootstrap
        self.tps = [TopicPartition(t, p) for t in sorted(set(topics)) for p in range(partitions)]
        self.read_committed = read_committed
        self.interval = interval
        self._history: dict[TopicPartition, deque[tuple[int, float]]] = {
            tp: deque(maxlen=history) for tp in self.tps
        }
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()

    def start(self) -> None:
        if self._task is None:
            self._stopping = asyncio.Event()
            self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        task, self._task = self._task, None
        await stopped(task, self._stopping)

    def end(self, topic: str, partition: int) -> int | None:
        # A TopicPartition is a named tuple: a plain tuple finds it, without making one.
        seen = self._history.get((topic, partition))
        return seen[-1][0] if seen else None

    def age_ms(self, topic: str, partition: int, offset: int, now: float) -> int:
        """Milliseconds since an end offset past ``offset`` was first seen (0 if none)."""
        seen = self._history.get((topic, partition))
        if not seen or seen[-1][0] <= offset:
            return 0
        first = next((at for end, at in seen if end > offset), seen[0][1])
        return max(0, round((now - first) * 1000))

    def written(self, topic: str, ends: Mapping[int, int], now: float) -> None:
        """End offsets this worker learned by writing (``POST /topics/{topic}/records``):
        a bounded read here counts the records at once, not only after the next poll
        (which other workers wait for). Only an end past the last one seen counts."""
        for partition, end in ends.items():
            seen = self._history.get((topic, partition))
            if seen is not None and (not seen or end > seen[-1][0]):
                seen.append((end, now))

    def observe(self, ends: Mapping[TopicPartition, int], now: float) -> None:
        for tp, end in ends.items():
            seen = self._history.get(tp)
            if seen is not None and (not seen or seen[-1][0] != end):
                seen.append((end, now))

    async def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                await self._read()
            except Exception as error:  # no broker to start with: keep trying
                logger.debug("input end offsets unavailable: %r; again in 2 s", error)
                await pause(self._stopping, 2.0)

    async def _read(self) -> None:
        isolation = "read_committed" if self.read_committed else "read_uncommitted"
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap, group_id=None, isolation_level=isolation
        )
        try:
            await consumer.start()
            while not self._stopping.is_set():
                try:
                    ends = await consumer.end_offsets(self.tps)
                    self.observe(ends, time.monotonic())
                except Exception as error:  # the brokers are away: keep the last figures
                    logger.debug("input end offsets unavailable: %r", error)
                await pause(self._stopping, self.interval)
        finally:
            with contextlib.suppress(Exception):
                await consumer.stop()


class Positions:
    """The read positions of one worker's copies."""

    def __init__(
        self, lineage: Lineage, partitions: int, sources: Iterable[str], ends: InputEnds
    ) -> None:
        self.lineage = lineage
        self.partitions = partitions
        #: topics that tokens and ``applied`` name: the contract's source topics
        self.sources = frozenset(sources)
        self.ends = ends
        #: per copy, what its last stored position gave
        self._seen: dict[tuple[str, int], _Stored] = {}
        #: per table, its source topics (the pipelines do not change while they run)
        self._sources_of: dict[str, dict[str, str]] = {}
        #: per topic partition kept whole (a global table's), its last applied offsets
        self._kept: dict[tuple[str, int], _Kept] = {}

    def sources_of(self, table: str) -> dict[str, str]:
        """The source topics of ``table`` and how they reach it (direct or upstream)."""
        found = self._sources_of.get(table)
        if found is None:
            found = {t: r for t, r in self.lineage.sources(table).items() if t in self.sources}
            self._sources_of[table] = found
        return found

    def feeding(self, table: str, topic: str, partition: int) -> list[int]:
        """The partitions of source ``topic`` that feed ``partition`` of ``table``."""
        reach = self.sources_of(table).get(topic)
        if reach is None:
            return []
        return [partition] if reach == "direct" else list(range(self.partitions))

    def of(self, table: str, partition: int, stored: bytes | None) -> ReadPosition:
        """The read position of a copy whose stored position is ``stored``."""
        key = (table, partition)
        seen = self._seen.get(key)
        if seen is None or seen.stored != stored:
            seen = self._seen[key] = self._stored(table, partition, stored)
        lag_records: int | None = 0
        lag_ms = 0
        now = time.monotonic()
        for topic, done in seen.feeds:
            end = self.ends.end(topic, partition)
            if end is None:
                lag_records = None
                continue
            if end > done:
                if lag_records is not None:
                    lag_records += end - done
                lag_ms = max(lag_ms, self.ends.age_ms(topic, partition, done, now))
        # An unknown lag is unknown in time too: it satisfies no max_lag_ms.
        age = None if lag_records is None else (lag_ms if lag_records else 0)
        return ReadPosition(partition, seen.applied, lag_records, age, seen.shown)

    def of_topic(self, topic: str, partition: int, applied: int) -> ReadPosition:
        """The read position of a copy of one partition of ``topic`` that holds its
        records below ``applied`` (a global table's copy): fed by that partition alone."""
        key = (topic, partition)
        kept = self._kept.get(key)
        if kept is None or kept[0] != applied:
            offsets = {topic: {partition: applied}}
            kept = self._kept[key] = (applied, offsets, shown_applied(offsets))
        end = self.ends.end(topic, partition)
        if end is None:
            return ReadPosition(partition, kept[1], None, None, kept[2])
        lag = max(0, end - applied)
        age = self.ends.age_ms(topic, partition, applied, time.monotonic()) if lag else 0
        return ReadPosition(partition, kept[1], lag, age, kept[2])

    def _stored(self, table: str, partition: int, stored: bytes | None) -> _Stored:
        position = Position.decode(stored) if stored is not None else Position()
        applied = {
            topic: {
                p: position.applied.get(topic, {}).get(p, 0)
                for p in self.feeding(table, topic, partition)
            }
            for topic in sorted(self.sources_of(table))
        }
        feeds = tuple(
            (topic, position.applied.get(topic, {}).get(partition, 0))
            for topic in sorted(self.lineage.feeds.get(table, ()))
        )
        return _Stored(stored, applied, shown_applied(applied), feeds)


#: a kept partition's applied offset, and its ``applied`` as read positions hold and show it
_Kept = tuple[int, dict[str, dict[int, int]], dict[str, dict[str, int]]]


@dataclass(frozen=True)
class _Stored:
    """What a copy's stored position gives every read until the copy moves on: the
    offsets it applied, as read positions show them, and of the topics that feed it."""

    stored: bytes | None
    applied: dict[str, dict[int, int]]
    shown: dict[str, dict[str, int]]
    feeds: tuple[tuple[str, int], ...]


class HeldPositions:
    """The stored positions of this worker's active copies, as the engine last wrote
    them, so that a read of an active copy need not read its position from the database.

    A copy's entry is read from its database on the first read, and replaced by every
    cycle that writes the copy: the engine writes its stores and then tells its
    listeners, on the event loop the reads run on, so no read sees a database newer than
    this. Every revocation forgets all of them: the copies of the next assignment may be
    restored from their changelogs, which tells no listener.
    """

    def __init__(self) -> None:
        self._held: dict[tuple[str, int], bytes | None] = {}

    def get(self, table: str, partition: int, stored: Callable[[], bytes | None]) -> bytes | None:
        key = (table, partition)
        try:
            return self._held[key]
        except KeyError:
            found = self._held[key] = stored()
            return found

    def moved(self, table: str, partition: int, position: bytes | None) -> None:
        """A cycle wrote ``position`` (None: it wrote no position) to the copy."""
        if position is not None:
            self._held[(table, partition)] = position

    def forget(self) -> None:
        self._held.clear()


class PositionWaits:
    """Wakes the reads that wait for a position whenever a copy may have moved on."""

    def __init__(self) -> None:
        self._moved = asyncio.Event()
        #: reads waiting now; waits begun; reads that timed out
        self.waiting = 0
        self.waits = 0
        self.timeouts = 0

    def notify(self) -> None:
        moved, self._moved = self._moved, asyncio.Event()
        moved.set()

    async def next_move(self, seconds: float) -> None:
        """Until the next :meth:`notify`, or ``seconds``."""
        moved = self._moved
        self.waiting += 1
        self.waits += 1
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(moved.wait(), seconds)
        finally:
            self.waiting -= 1


class ConsistencyCollector(Collector):
    """Waits for positions, their timeouts, and open change streams, for /metrics."""

    def __init__(self, waits: PositionWaits, hub: Any) -> None:
        self.waits = waits
        self.hub = hub

    def collect(self) -> Iterator[Any]:
        yield GaugeMetricFamily(
            "streamstate_position_waiting",
            "Reads waiting now for a copy to reach their token's position.",
            value=self.waits.waiting,
        )
        yield CounterMetricFamily(
            "streamstate_position_waits",
            "Waits of reads for a copy to move on (one read may wait several times).",
            value=self.waits.waits,
        )
        yield CounterMetricFamily(
            "streamstate_position_wait_timeouts",
            "Reads answered 504: no copy reached their token's position in time.",
            value=self.waits.timeouts,
        )
        yield GaugeMetricFamily(
            "streamstate_change_streams_open",
            "Change streams open on this worker.",
            value=self.hub.open,
        )
        yield CounterMetricFamily(
            "streamstate_change_streams",
            "Change streams opened on this worker.",
            value=self.hub.opened,
        )
