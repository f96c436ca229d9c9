"""The load generator process: ``python -m chaos.loadgen --bootstrap ... --ledger ...``.

Runs outside the harness so that its producing does not share a GIL with the harness's
own reads and probes. Every 50 ms it writes what the target rates owe since the last
tick, as one record batch per topic partition (aiokafka ``create_batch``/``send_batch``,
acks=all, idempotent): text lines, item events at the synthetic event time, and the
payments that have come due (chaos/workload.py).

Each record carries a header ``chaos-seq``, its sequence number in its topic partition.
Each acknowledged batch appends (topic, partition, base offset, first seq, count) to the
ledger file, so a reader can later check that the topic holds exactly those sequence
numbers at those offsets: nothing acknowledged lost, nothing written twice.

Commands on stdin, one per line: ``pause`` (stop offering; answer once every batch in
flight is acknowledged or failed), ``resume``, ``rate LINES EVENTS`` (offer these rates
from now on), ``stop``. Every second, and after each command, one JSON line of figures on
stdout: among them ``running_s``, the wall time the generator was asked to offer (from
each resume to the next pause), and its stalls: ticks that came more than
``MAX_OWED_S`` after the one before (the machine or the producer held it up), whose time
beyond that is not offered at all (``skipped_s``).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import struct
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import orjson
from aiokafka import AIOKafkaProducer

from chaos.workload import Clock, Record, Workload

SEQ_HEADER = "chaos-seq"
TOPICS = ("text-lines", "item-events", "payments")
#: One ledger entry: topic index, partition, base offset, first seq, record count.
LEDGER_ENTRY = struct.Struct("<BHqqI")
TICK_S = 0.05
#: A generator that falls behind (a slow broker) owes at most this much; the rest is
#: not offered, rather than sent later as a burst.
MAX_OWED_S = 1.0
#: The stalls a report lists (the latest).
MAX_STALLS = 500


@dataclass
class Figures:
    """What was handed to the producer, acknowledged and failed, per topic."""

    offered: Counter[str] = field(default_factory=Counter)
    acked: Counter[str] = field(default_factory=Counter)
    failed: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    #: wall seconds asked to offer; the stalls (when, in running seconds, and how long)
    #: and the time not offered
    running_s: float = 0.0
    stalls: list[tuple[float, float]] = field(default_factory=list)
    skipped_s: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "offered": dict(self.offered),
            "acked": dict(self.acked),
            "failed": dict(self.failed),
            "errors": dict(self.errors),
            "running_s": round(self.running_s, 3),
            "stalls": [[round(at, 2), round(s, 2)] for at, s in self.stalls[-MAX_STALLS:]],
            "skipped_s": round(self.skipped_s, 2),
        }

    def elapsed(self, seconds: float) -> float:
        """Count ``seconds`` of wall time since the last tick; the part of it the
        generator still owes records for (at most ``MAX_OWED_S``)."""
        self.running_s += seconds
        if seconds <= MAX_OWED_S:
            return seconds
        self.stalls.append((self.running_s, seconds))
        self.skipped_s += seconds - MAX_OWED_S
        return MAX_OWED_S


class Generator:
    """Paces the workload into the producer and keeps the ledger."""

    def __init__(self, args: argparse.Namespace, ledger: BinaryIO) -> None:
        self.rates = {"text-lines": args.lines_per_s, "item-events": args.events_per_s}
        self.workload = Workload(args.seed, args.run_id)
        self.clock = Clock(args.clock_start_ms, args.clock_speed)
        self.ledger = ledger
        self.figures = Figures()
        self.seqs: Counter[tuple[str, int]] = Counter()
        self.inflight: set[asyncio.Future[Any]] = set()
        self.active_s = 0.0
        self.running = True
        self._owed = {topic: 0.0 for topic in self.rates}

    async def tick(self, producer: AIOKafkaProducer, elapsed: float) -> None:
        """Offer what the rates owe for ``elapsed`` seconds of wall time."""
        elapsed = self.figures.elapsed(elapsed)
        self.active_s += elapsed
        now_ms = self.clock.at(self.active_s)
        counts = {}
        for topic, rate in self.rates.items():
            self._owed[topic] += rate * elapsed
            counts[topic] = int(self._owed[topic])
            self._owed[topic] -= counts[topic]
        await self.send(producer, "text-lines", self.workload.next_lines(counts["text-lines"]))
        events = self.workload.next_events(counts["item-events"], now_ms)
        await self.send(producer, "item-events", events)
        await self.send(producer, "payments", self.workload.due_payments(now_ms))

    async def send(self, producer: AIOKafkaProducer, topic: str, records: list[Record]) -> None:
        by_partition: dict[int, list[Record]] = {}
        for record in records:
            by_partition.setdefault(record.partition, []).append(record)
        for partition, batch_records in sorted(by_partition.items()):
            await self._send_partition(producer, topic, partition, batch_records)

    async def _send_partition(
        self, producer: AIOKafkaProducer, topic: str, partition: int, records: list[Record]
    ) -> None:
        batch, first, count = producer.create_batch(), self.seqs[(topic, partition)], 0
        for record in records:
            seq = self.seqs[(topic, partition)]
            headers = [(SEQ_HEADER, str(seq).encode())]
            if batch.append(key=record.key, value=record.value, timestamp=None, headers=headers):
                self.seqs[(topic, partition)] += 1
                count += 1
                continue
            await self._submit(producer, batch, topic, partition, first, count)
            batch, first, count = producer.create_batch(), seq, 0
            if not batch.append(
                key=record.key, value=record.value, timestamp=None, headers=headers
            ):
                raise ValueError(f"a {topic} record does not fit in an empty batch")
            self.seqs[(topic, partition)] += 1
            count = 1
        if count:
            await self._submit(producer, batch, topic, partition, first, count)

    async def _submit(
        self, producer: AIOKafkaProducer, batch: Any, topic: str, partition: int, first: int, n: int
    ) -> None:
        self.figures.offered[topic] += n
        try:
            future = await producer.send_batch(batch, topic, partition=partition)
        except Exception as error:  # the accumulator refused it (the broker gone too long)
            self._failed(topic, n, error)
            return
        self.inflight.add(future)
        future.add_done_callback(lambda f: self._settled(f, topic, partition, first, n))

    def _settled(
        self, future: asyncio.Future[Any], topic: str, partition: int, first: int, n: int
    ) -> None:
        self.inflight.discard(future)
        error = None if future.cancelled() else future.exception()
        if future.cancelled() or error is not None:
            self._failed(topic, n, error)
            return
        self.figures.acked[topic] += n
        entry = (TOPICS.index(topic), partition, future.result().offset, first, n)
        self.ledger.write(LEDGER_ENTRY.pack(*entry))

    def _failed(self, topic: str, n: int, error: BaseException | None) -> None:
        self.figures.failed[topic] += n
        self.figures.errors[type(error).__name__] += 1

    async def drain(self) -> None:
        """Wait until every batch in flight is acknowledged or failed."""
        while self.inflight:
            await asyncio.wait(set(self.inflight))
        self.ledger.flush()

    def report(self, event: str) -> None:
        figures = {
            "event": event,
            "t": time.time(),
            "running": self.running,
            "active_s": round(self.active_s, 3),
            "clock_ms": self.clock.at(self.active_s),
            "pending_payments": self.workload.pending_payments,
            **self.figures.as_dict(),
        }
        sys.stdout.write(orjson.dumps(figures).decode() + "\n")
        sys.stdout.flush()


def _commands(loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[str]) -> None:
    """Read stdin lines into ``queue`` (in a thread: stdin is a blocking pipe)."""
    for line in sys.stdin:
        loop.call_soon_threadsafe(queue.put_nowait, line.strip())
    loop.call_soon_threadsafe(queue.put_nowait, "stop")


async def run(args: argparse.Namespace, ledger: BinaryIO) -> None:
    producer = AIOKafkaProducer(
        bootstrap_servers=args.bootstrap,
        acks="all",
        enable_idempotence=True,
        max_batch_size=256 * 1024,
        request_timeout_ms=args.request_timeout_ms,
        retry_backoff_ms=200,
    )
    await producer.start()
    queue: asyncio.Queue[str] = asyncio.Queue()
    loop = asyncio.get_running_loop()
    threading.Thread(target=_commands, args=(loop, queue), daemon=True).start()
    generator = Generator(args, ledger)
    try:
        await _loop(generator, producer, queue)
    finally:
        await generator.drain()
        await producer.stop()
        generator.report("stopped")


async def _loop(
    generator: Generator, producer: AIOKafkaProducer, queue: asyncio.Queue[str]
) -> None:
    last = time.monotonic()
    next_report = last + 1.0
    while True:
        while not queue.empty():
            command = queue.get_nowait()
            if command == "stop":
                return
            if command == "pause" and generator.running:
                generator.running = False
                await generator.drain()
            elif command == "resume" and not generator.running:
                generator.running = True
                last = time.monotonic()
            elif command.startswith("rate "):
                lines, events = command.split()[1:3]
                generator.rates = {"text-lines": float(lines), "item-events": float(events)}
            generator.report(command.split()[0])
        now = time.monotonic()
        if generator.running:
            await generator.tick(producer, now - last)
        last = now
        if now >= next_report:
            generator.ledger.flush()
            generator.report("tick")
            next_report = now + 1.0
        await asyncio.sleep(max(0.0, TICK_S - (time.monotonic() - now)))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m chaos.loadgen", description=__doc__)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--ledger", required=True, help="file the acknowledged batches go to")
    parser.add_argument("--lines-per-s", type=float, required=True)
    parser.add_argument("--events-per-s", type=float, required=True)
    parser.add_argument("--clock-start-ms", type=int, required=True)
    parser.add_argument("--clock-speed", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--run-id", default="r1", help="prefix of event and payment ids")
    parser.add_argument("--request-timeout-ms", type=int, default=120_000)
    args = parser.parse_args(argv)
    # The client logs every failed connection while a broker is away; the figures count
    # what matters (batches not acknowledged).
    logging.basicConfig(level=logging.CRITICAL)
    with Path(args.ledger).open("ab") as ledger:
        asyncio.run(run(args, ledger))


if __name__ == "__main__":
    main()
