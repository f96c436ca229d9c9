"""A steady producer of text lines and item events, run in its own thread.

Every record carries a header ``chaos-seq`` with its sequence number, so that what the
producer saw acknowledged can be matched with what the source topics hold: the ground
truth is computed from the topics, the loss check from the acknowledgements.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiokafka import AIOKafkaProducer

VOCABULARY = [
    *("the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "stream", "state"),
    *("table", "kafka", "worker", "changelog", "standby", "restore", "partition", "offset"),
    *("commit", "crash", "kill", "replay", "count", "straße", "café", "naïve", "ΣΟΦΙΑ"),
    *("élan", "über"),
]
STORES = [f"store-{n:02d}" for n in range(6)]
SKUS = ["DAI-1", "BAK-1", "DRI-1"]
SEQ_HEADER = "chaos-seq"


def text_line(rng: random.Random) -> str:
    return " ".join(rng.choice(VOCABULARY) for _ in range(rng.randint(3, 8)))


def item_event(rng: random.Random, seq: int, now_ms: int) -> dict[str, Any]:
    kind = rng.choice(["sale", "sale", "restock", "adjust"])
    event: dict[str, Any] = {
        "event_id": f"chaos-{seq}",
        "store_id": rng.choice(STORES),
        "sku": rng.choice(SKUS),
        "kind": kind,
        "quantity": rng.randint(1, 9) if kind != "adjust" else rng.choice([-2, -1, 1, 3]),
        "ts": now_ms,
    }
    if kind == "sale":
        event["unit_price"] = rng.choice([0.5, 1.25, 2.0])
    return event


@dataclass
class LoadStats:
    """What the producer sent and what the brokers acknowledged."""

    sent: int = 0
    acked: set[int] = field(default_factory=set)
    failed: int = 0
    errors: dict[str, int] = field(default_factory=dict)


class SteadyLoad:
    """Writes ``lines_per_s`` text lines and ``events_per_s`` item events per second.

    ``pause()`` stops new sends and waits until every sent record is acknowledged or
    failed; ``resume()`` starts again. Producers use acks=all and idempotence, so a
    broker failover does not duplicate records.
    """

    def __init__(
        self, bootstrap: str, lines_per_s: float, events_per_s: float, seed: int = 1
    ) -> None:
        self.bootstrap = bootstrap
        self.lines_per_s = lines_per_s
        self.events_per_s = events_per_s
        self.rng = random.Random(seed)
        self.stats = LoadStats()
        self._running = threading.Event()
        self._stop = threading.Event()
        self._idle = threading.Event()
        self._thread = threading.Thread(target=self._main, name="chaos-load", daemon=True)
        self._seq = 0

    def start(self) -> SteadyLoad:
        self._running.set()
        self._thread.start()
        return self

    def pause(self, timeout: float = 120.0) -> None:
        self._idle.clear()
        self._running.clear()
        if not self._idle.wait(timeout):
            raise TimeoutError(f"the producer did not drain in {timeout}s")

    def resume(self) -> None:
        self._idle.clear()
        self._running.set()

    def stop(self) -> None:
        self._stop.set()
        self._running.set()
        self._thread.join(180)

    def _main(self) -> None:
        # The client logs every failed connection while a broker is away; the figures
        # count the failures that matter (records not acknowledged).
        logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
        asyncio.run(self._run())

    async def _run(self) -> None:
        producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap,
            acks="all",
            enable_idempotence=True,
            linger_ms=20,
            request_timeout_ms=120_000,
        )
        await producer.start()
        pending: set[asyncio.Future[Any]] = set()
        try:
            while not self._stop.is_set():
                if not self._running.is_set():
                    if pending:
                        await asyncio.wait(pending)
                    self._idle.set()
                    await asyncio.sleep(0.05)
                    continue
                started = time.monotonic()
                pending |= await self._send_second(producer)
                pending = {f for f in pending if not f.done()}
                await asyncio.sleep(max(0.0, 1.0 - (time.monotonic() - started)))
            if pending:
                await asyncio.wait(pending)
        finally:
            await producer.stop()

    async def _send_second(self, producer: AIOKafkaProducer) -> set[asyncio.Future[Any]]:
        """One second's worth of records, spread over ten ticks."""
        futures: set[asyncio.Future[Any]] = set()
        lines, events = self.lines_per_s / 10, self.events_per_s / 10
        owed_lines = owed_events = 0.0
        for _ in range(10):
            if not self._running.is_set() or self._stop.is_set():
                break
            owed_lines += lines
            owed_events += events
            while owed_lines >= 1:
                owed_lines -= 1
                futures.add(await self._send(producer, "text-lines", None, text_line(self.rng)))
            while owed_events >= 1:
                owed_events -= 1
                event = item_event(self.rng, self._seq, int(time.time() * 1000))
                key = event["store_id"].encode()
                futures.add(await self._send(producer, "item-events", key, event))
            await asyncio.sleep(0.1)
        return futures

    async def _send(
        self, producer: AIOKafkaProducer, topic: str, key: bytes | None, value: Any
    ) -> asyncio.Future[Any]:
        seq = self._seq
        self._seq += 1
        raw = value.encode() if isinstance(value, str) else orjson.dumps(value)
        headers = [(SEQ_HEADER, str(seq).encode())]
        self.stats.sent += 1
        try:
            future: asyncio.Future[Any] = await producer.send(topic, raw, key=key, headers=headers)
        except Exception as error:  # the accumulator refused it (broker gone too long)
            self._failed(error)
            done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            done.set_result(None)
            return done
        future.add_done_callback(lambda f: self._settled(seq, f))
        return future

    def _settled(self, seq: int, future: asyncio.Future[Any]) -> None:
        if future.cancelled() or future.exception() is not None:
            self._failed(future.exception())
        else:
            self.stats.acked.add(seq)

    def _failed(self, error: BaseException | None) -> None:
        self.stats.failed += 1
        name = type(error).__name__
        self.stats.errors[name] = self.stats.errors.get(name, 0) + 1
