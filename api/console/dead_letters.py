"""The latest records of the dead-letter topics, for the console's Dead letters view.

A :class:`DeadLetterTail` reads every ``<topic>-dlq`` of the loaded pipelines from a few
records before their end and goes on reading what arrives, keeping the latest records
of each partition in memory (values cut to a preview; a replay reads the whole record
again from Kafka). It starts on the first request that needs it, so a worker whose
console nobody opens reads nothing. It reads ``read_committed``: under exactly_once a
dead letter of an aborted cycle was never sent.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from api.background import pause, stopped
from tables.pipeline import ERROR_HEADER

logger = logging.getLogger(__name__)

#: Header a replay writes on the records it sends: the dead letter it came from.
REPLAYED_FROM_HEADER = "replayed-from"
#: Bytes of a value the view shows.
PREVIEW_BYTES = 2048
#: How long a request waits for the first read of the topics' latest records.
FIRST_READ_S = 3.0


def coordinates(topic: str, partition: int, offset: int) -> str:
    """How a dead letter is named in the replay log and the ``replayed-from`` header."""
    return f"{topic}/{partition}/{offset}"


def _text(raw: bytes | None, size: int | None = None) -> dict[str, Any]:
    """Raw bytes as UTF-8 text when they are, else base64. ``raw`` may be the first bytes
    of a value of ``size`` bytes (a preview)."""
    if raw is None:
        return {"text": None, "base64": None, "bytes": 0, "truncated": False}
    whole = len(raw) if size is None else size
    text = _utf8(raw, cut_short=whole > len(raw))
    return {
        "text": text,
        "base64": base64.b64encode(raw).decode("ascii") if text is None else None,
        "bytes": whole,
        "truncated": whole > len(raw),
    }


def _utf8(raw: bytes, *, cut_short: bool) -> str | None:
    """``raw`` as text, or None when it is not UTF-8 (a cut may split its last character)."""
    for trim in range(4 if cut_short else 1):
        try:
            return raw[: len(raw) - trim].decode("utf-8")
        except UnicodeDecodeError:
            continue
    return None


def _int(raw: bytes | None) -> int | None:
    try:
        return None if raw is None else int(raw.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        return None


@dataclass(frozen=True)
class DeadLetter:
    """One dead-letter record, as the view shows it."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    #: the whole value's length (``value`` may hold only its first bytes)
    size: int = 0

    @classmethod
    def of(cls, record: Any, preview: int | None = PREVIEW_BYTES) -> DeadLetter:
        value = record.value
        size = 0 if value is None else len(value)
        if preview is not None and value is not None:
            value = value[:preview]
        return cls(
            record.topic,
            record.partition,
            record.offset,
            int(record.timestamp),
            record.key,
            value,
            tuple((k, bytes(v or b"")) for k, v in (record.headers or ())),
            size,
        )

    @property
    def whole(self) -> bool:
        """Whether ``value`` is the whole value (not a preview)."""
        return self.value is None or len(self.value) == self.size

    def header(self, name: str) -> bytes | None:
        return next((v for k, v in self.headers if k == name), None)

    @property
    def name(self) -> str:
        return coordinates(self.topic, self.partition, self.offset)

    def as_dict(self) -> dict[str, Any]:
        error = self.header(ERROR_HEADER)
        source_topic = self.header("source-topic")
        replayed_from = self.header(REPLAYED_FROM_HEADER)
        value = _text(self.value, self.size)
        return {
            "topic": self.topic,
            "partition": self.partition,
            "offset": self.offset,
            "timestamp": self.timestamp,
            "key": _text(self.key),
            "value": value,
            "error": None if error is None else error.decode("utf-8", "replace"),
            "source": {
                "topic": None if source_topic is None else source_topic.decode("utf-8", "replace"),
                "partition": _int(self.header("source-partition")),
                "offset": _int(self.header("source-offset")),
            },
            "replayed_from": None
            if replayed_from is None
            else replayed_from.decode("utf-8", "replace"),
        }


class DeadLetterTail:
    """The latest ``keep`` records of each partition of the dead-letter topics."""

    def __init__(
        self, bootstrap: str, topics: Iterable[str], partitions: int, keep: int = 50
    ) -> None:
        self.bootstrap = bootstrap
        self.topics = sorted(set(topics))
        self.partitions = partitions
        self.keep = keep
        self.tps = [TopicPartition(t, p) for t in self.topics for p in range(partitions)]
        self.latest: dict[TopicPartition, deque[DeadLetter]] = {
            tp: deque(maxlen=keep) for tp in self.tps
        }
        #: per partition, the offset after the last record read (the end, once caught up)
        self.positions: dict[TopicPartition, int] = {}
        self.caught_up = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()

    def start(self) -> None:
        if self._task is None:
            self._stopping = asyncio.Event()
            self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        task, self._task = self._task, None
        await stopped(task, self._stopping)

    async def records(self, topic: str | None, limit: int) -> list[DeadLetter]:
        """The latest ``limit`` dead letters (of ``topic``, or of all), newest first."""
        self.start()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.caught_up.wait(), FIRST_READ_S)
        found = [
            letter
            for tp, letters in self.latest.items()
            if topic is None or tp.topic == topic
            for letter in letters
        ]
        found.sort(key=lambda r: (r.timestamp, r.offset), reverse=True)
        return found[:limit]

    def counts(self) -> dict[str, int]:
        """Per dead-letter topic, the records read so far (the ends, once caught up)."""
        totals = dict.fromkeys(self.topics, 0)
        for tp, position in self.positions.items():
            totals[tp.topic] += position
        return totals

    async def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                await self._read()
            except asyncio.CancelledError:
                raise
            except Exception as error:  # the brokers are away: read again from the latest
                # /ready and the engine report a broker outage; this would only repeat it.
                logger.debug("the dead-letter topics cannot be read: %r; again in 2 s", error)
                await pause(self._stopping, 2.0)

    async def _read(self) -> None:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            group_id=None,
            enable_auto_commit=False,
            isolation_level="read_committed",
        )
        try:
            await consumer.start()
            consumer.assign(self.tps)
            targets = await self._seek_to_latest(consumer)
            for letters in self.latest.values():
                letters.clear()
            while not self._stopping.is_set():
                batches = await consumer.getmany(timeout_ms=500, max_records=2000)
                for tp, records in batches.items():
                    self.latest[tp].extend(DeadLetter.of(r) for r in records)
                for tp in self.tps:
                    self.positions[tp] = await consumer.position(tp)
                if not self.caught_up.is_set() and all(
                    self.positions[tp] >= end for tp, end in targets.items()
                ):
                    self.caught_up.set()
        finally:
            with contextlib.suppress(Exception):
                await consumer.stop()

    async def _seek_to_latest(self, consumer: AIOKafkaConsumer) -> dict[TopicPartition, int]:
        starts = await consumer.beginning_offsets(self.tps)
        ends = await consumer.end_offsets(self.tps)
        for tp in self.tps:
            consumer.seek(tp, max(starts[tp], ends[tp] - self.keep))
        return dict(ends)


async def fetch(
    bootstrap: str, wanted: Sequence[tuple[str, int, int]], wait_s: float = 5.0
) -> dict[tuple[str, int, int], DeadLetter]:
    """The whole records at (topic, partition, offset), read from Kafka; absent ones
    (deleted by retention, never written, an aborted or marker offset) are left out."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        isolation_level="read_committed",
    )
    found: dict[tuple[str, int, int], DeadLetter] = {}
    try:
        await consumer.start()
        for topic, partition, offset in wanted:
            tp = TopicPartition(topic, partition)
            consumer.assign([tp])
            ends = await consumer.end_offsets([tp])
            if offset >= ends[tp]:
                continue
            consumer.seek(tp, offset)
            deadline = asyncio.get_running_loop().time() + wait_s
            while asyncio.get_running_loop().time() < deadline:
                batch = await consumer.getmany(tp, timeout_ms=200, max_records=1)
                records = batch.get(tp, [])
                if records:
                    if records[0].offset == offset:
                        found[(topic, partition, offset)] = DeadLetter.of(records[0], None)
                    break
                if await consumer.position(tp) > offset:
                    break
    finally:
        await consumer.stop()
    return found
