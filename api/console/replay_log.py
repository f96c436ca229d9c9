"""The replay log: which dead letters were replayed, so that each is replayed at most once.

Every replay is recorded in a compacted topic, ``<app id>-dead-letter-replays`` (one
partition, so that its records have one order), keyed by the dead letter's coordinates
``<dlq topic>/<partition>/<offset>``. Every worker reads the whole topic and keeps its
state (:class:`ReplayStates`), so a dead letter replayed through one worker is refused by
every other, and after any restart.

Two workers may be asked to replay the same dead letter at the same moment. Each first
writes a *claim* (a random id) and reads the log up to it: the first claim of a dead
letter in the log wins, and only its writer replays; the other answers that the record
is taken. After the replay the winner writes the outcome under the same claim id. A
worker that dies between its claim and its outcome leaves the claim standing: the dead
letter is refused from then on ("claimed, outcome unknown"), because it may or may not
have reached its source topic, and the operator decides from the source topic (each
replayed record carries a ``replayed-from`` header naming its dead letter).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from api.background import pause, stopped
from core.admin import ensure_topics
from core.topics import TopicSpec

logger = logging.getLogger(__name__)

#: How long a replay waits for the log to reach its claim, or the end, in seconds.
LOG_WAIT_S = 10.0


def replay_log_topic(app_id: str) -> str:
    return f"{app_id}-dead-letter-replays"


@dataclass
class ReplayStates:
    """The replay log as a state: per dead letter, its first claim and that claim's
    latest outcome. Later claims of the same dead letter lost: they are ignored."""

    entries: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: the offset after the last log record applied
    position: int = 0

    def apply(self, key: str, value: Mapping[str, Any], offset: int) -> None:
        first = self.entries.get(key)
        if first is None:
            self.entries[key] = {**value, "log_offset": offset}
        elif first.get("claim") == value.get("claim"):
            first.update(value)
        self.position = max(self.position, offset + 1)

    def get(self, key: str) -> dict[str, Any] | None:
        return self.entries.get(key)

    def won(self, key: str, claim: str) -> bool:
        entry = self.entries.get(key)
        return entry is not None and entry.get("claim") == claim


class ReplayLog:
    """The replay log of one worker: reads the topic from its start, and writes claims
    and outcomes to it. Started on first use."""

    def __init__(self, bootstrap: str, topic: str, replication_factor: int) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.tp = TopicPartition(topic, 0)
        self.replication_factor = replication_factor
        self.states = ReplayStates()
        self._moved = asyncio.Condition()
        self._producer: AIOKafkaProducer | None = None
        self._reader: AIOKafkaConsumer | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        async with self._lock:
            if self._task is not None:
                return
            spec = TopicSpec(self.topic, 1, {"cleanup.policy": "compact"})
            await ensure_topics(self.bootstrap, [spec], self.replication_factor)
            producer = AIOKafkaProducer(
                bootstrap_servers=self.bootstrap, acks="all", enable_idempotence=True
            )
            reader = AIOKafkaConsumer(
                bootstrap_servers=self.bootstrap,
                group_id=None,
                enable_auto_commit=False,
                isolation_level="read_committed",
            )
            try:
                await producer.start()
                await reader.start()
                reader.assign([self.tp])
                await reader.seek_to_beginning(self.tp)
            except BaseException:  # failed, or the worker stops meanwhile: close them
                for client in (producer, reader):
                    with contextlib.suppress(Exception):
                        await client.stop()
                raise
            self._producer, self._reader = producer, reader
            self._stopping = asyncio.Event()
            self._task = asyncio.ensure_future(self._read())

    async def stop(self) -> None:
        task, self._task = self._task, None
        await stopped(task, self._stopping)
        for client in (self._producer, self._reader):
            if client is not None:
                with contextlib.suppress(Exception):
                    await client.stop()
        self._producer = self._reader = None

    async def _read(self) -> None:
        assert self._reader is not None
        while not self._stopping.is_set():
            try:
                batches = await self._reader.getmany(self.tp, timeout_ms=500)
                position = await self._reader.position(self.tp)
            except Exception as error:  # the brokers are away: waits time out meanwhile
                logger.debug("the replay log cannot be read: %r; again in 2 s", error)
                await pause(self._stopping, 2.0)
                continue
            async with self._moved:
                for record in batches.get(self.tp, []):
                    if record.key is None or record.value is None:
                        continue
                    try:
                        value = orjson.loads(record.value)
                    except orjson.JSONDecodeError:
                        continue
                    self.states.apply(record.key.decode("utf-8", "replace"), value, record.offset)
                self.states.position = max(self.states.position, position)
                self._moved.notify_all()

    async def wait_for(self, offset: int) -> None:
        """Until the state holds the log up to ``offset`` (excluded); TimeoutError after
        :data:`LOG_WAIT_S`."""
        async with asyncio.timeout(LOG_WAIT_S), self._moved:
            await self._moved.wait_for(lambda: self.states.position >= offset)

    async def caught_up(self) -> None:
        """Until the state holds every record the log holds now."""
        await self.start()
        assert self._reader is not None
        ends = await self._reader.end_offsets([self.tp])
        await self.wait_for(ends[self.tp])

    async def write(self, key: str, value: Mapping[str, Any]) -> int:
        """Append one record to the log; its offset once the brokers hold it."""
        await self.start()
        assert self._producer is not None
        sent = await self._producer.send_and_wait(
            self.topic, orjson.dumps(dict(value)), key=key.encode("utf-8"), partition=0
        )
        return int(sent.offset)

    async def send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        partition: int | None,
        headers: list[tuple[str, bytes]],
    ) -> dict[str, Any]:
        """Produce one record with acks=all (the replays' producer); where it went."""
        await self.start()
        assert self._producer is not None
        sent = await self._producer.send_and_wait(
            topic, value, key=key, partition=partition, headers=headers
        )
        return {"topic": topic, "partition": int(sent.partition), "offset": int(sent.offset)}

    async def claim(self, key: str, by: str) -> str | None:
        """Claim the replay of a dead letter: the claim's id when it is the first, else
        None (another claim came first)."""
        claim = uuid.uuid4().hex
        record = {"claim": claim, "status": "claimed", "by": by, "at": _now_ms()}
        offset = await self.write(key, record)
        await self.wait_for(offset + 1)
        return claim if self.states.won(key, claim) else None

    async def record(self, key: str, claim: str, by: str, outcome: Mapping[str, Any]) -> None:
        """The outcome of a won claim (complete in itself: compaction keeps only it)."""
        await self.write(key, {"claim": claim, "by": by, **outcome, "done_at": _now_ms()})


def _now_ms() -> int:
    return int(time.time() * 1000)
