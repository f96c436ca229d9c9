"""The group's progress over time: committed offsets against end offsets, once a second.

A :class:`LagMonitor` runs in its own thread with its own clients. From its samples come
the processed rates (committed offsets moving), the lag (end minus committed per
partition, summed over every topic the group reads) and the moment the group has caught
up (lag 0 everywhere).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from chaos.reader import committed_offsets
from core.admin import partitions_of

T = TypeVar("T")
GROUP = "streamstate"
SOURCES = ("text-lines", "item-events", "payments", "products")
REPARTITIONS = (
    "streamstate-word_counts-repartition",
    "streamstate-sales_by_category-repartition",
)
INPUTS = SOURCES + REPARTITIONS


@dataclass(frozen=True)
class Sample:
    """One observation, per topic: the sum of the end offsets, of the committed offsets,
    and of each partition's lag (its end minus its committed offset, at least 0)."""

    at: float
    ends: dict[str, int]
    committed: dict[str, int]
    lags: dict[str, int]

    def lag(self, topics: tuple[str, ...] = INPUTS) -> int:
        return sum(self.lags.get(t, 0) for t in topics)


def sample_of(
    at: float, ends: Mapping[tuple[str, int], int], committed: Mapping[tuple[str, int], int]
) -> Sample:
    """A sample from per-partition offsets. The lag is counted per partition: a partition
    whose committed offset has passed the end read for it must not hide another one's
    lag, as sums per topic would."""
    end_sums: dict[str, int] = {}
    lags: dict[str, int] = {}
    for (topic, partition), end in ends.items():
        end_sums[topic] = end_sums.get(topic, 0) + end
        behind = max(0, end - committed.get((topic, partition), 0))
        lags[topic] = lags.get(topic, 0) + behind
    committed_sums: dict[str, int] = {}
    for (topic, _partition), offset in committed.items():
        committed_sums[topic] = committed_sums.get(topic, 0) + offset
    return Sample(at, end_sums, committed_sums, lags)


def watch_only(consumer: AIOKafkaConsumer, tps: list[TopicPartition]) -> None:
    """Assign ``tps`` to a consumer that only reads their end offsets, paused: its fetcher
    would otherwise keep a fetch in flight, which the broker holds up to
    ``fetch_max_wait_ms`` when nothing is new, and the connection's next request (the
    sample's end offsets) would wait behind it."""
    consumer.assign(tps)
    consumer.pause(*tps)


class LagMonitor:
    """Samples the group once every ``interval`` seconds until stopped."""

    def __init__(self, bootstrap: str, interval: float = 1.0) -> None:
        self.bootstrap = bootstrap
        self.interval = interval
        self.samples: list[Sample] = []
        self.failures = 0
        self.errors: dict[str, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name="lag-monitor", daemon=True)

    def start(self) -> LagMonitor:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(15)

    def _main(self) -> None:
        logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
        asyncio.run(self._run())

    async def _run(self) -> None:
        clients: tuple[AIOKafkaConsumer, AIOKafkaAdminClient] | None = None
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                if clients is None:
                    clients = await _bounded(self._connect(), 10.0)
                consumer, admin = clients
                self.samples.append(await _bounded(self._sample(consumer, admin), 5.0))
            # A broker away: the sample is missing, not wrong. aiokafka lets a
            # CancelledError of its own out when a connection drops under a request.
            except (Exception, asyncio.CancelledError) as error:
                self.failures += 1
                self.errors[type(error).__name__] = repr(error)[:200]
                if clients is not None:
                    await _close(*clients)
                clients = None
            await asyncio.sleep(max(0.05, self.interval - (time.monotonic() - started)))
        if clients is not None:
            await _close(*clients)

    async def _connect(self) -> tuple[AIOKafkaConsumer, AIOKafkaAdminClient]:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            group_id=None,
            isolation_level="read_committed",
            request_timeout_ms=4000,
        )
        admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap, request_timeout_ms=4000)
        try:
            await consumer.start()
            await admin.start()
            watch_only(consumer, await self._partitions())
        except BaseException:  # cancelled by the timeout too: leave no client behind
            await _close(consumer, admin)
            raise
        return consumer, admin

    async def _partitions(self) -> list[TopicPartition]:
        tps = []
        for topic in INPUTS:
            found = await partitions_of(self.bootstrap, topic, wait_s=0.0)
            tps += [TopicPartition(topic, p) for p in found]
        return tps

    async def _sample(self, consumer: AIOKafkaConsumer, admin: AIOKafkaAdminClient) -> Sample:
        # The moment the sample was asked for: every record acknowledged before it
        # counts in its end offsets.
        at = time.monotonic()
        if {tp.topic for tp in consumer.assignment()} != set(INPUTS):
            watch_only(consumer, await self._partitions())  # the workers create some later
        # The committed offsets first, then the ends: a partition counts as caught up
        # only if what it had committed reached an end read after it. Read the other way
        # round, a source partition could commit (with the records its cycle sent to a
        # repartition topic) after the ends were read, and those records would be
        # missing from the ends: caught up too early.
        committed = await committed_offsets(admin, GROUP)
        ends = await consumer.end_offsets(list(consumer.assignment()))
        return sample_of(at, {(tp.topic, tp.partition): e for tp, e in ends.items()}, committed)

    # -- reading the samples ----------------------------------------------------------

    def latest(self) -> Sample | None:
        return self.samples[-1] if self.samples else None

    def between(self, start: float, end: float) -> list[Sample]:
        return [s for s in self.samples if start <= s.at <= end]

    def peak_lag(self, start: float, end: float) -> int | None:
        found = self.between(start, end)
        return max(s.lag() for s in found) if found else None

    def lag_at(self, moment: float) -> int | None:
        """The lag of the last sample at or before ``moment``."""
        before = [s for s in self.samples if s.at <= moment]
        return before[-1].lag() if before else None

    def processed(self, topic: str, start: float, end: float) -> tuple[int, float] | None:
        """Records of ``topic`` the group committed between two moments, and the seconds
        between the samples that bound them."""
        found = self.between(start, end)
        if len(found) < 2:
            return None
        first, last = found[0], found[-1]
        return last.committed.get(topic, 0) - first.committed.get(topic, 0), last.at - first.at

    def first_at_most(self, lag: int, since: float) -> float | None:
        """The first moment after ``since`` at which the lag was at most ``lag``."""
        for sample in self.samples:
            if sample.at >= since and sample.lag() <= lag:
                return sample.at
        return None

    def wait_caught_up(self, timeout: float, since: float | None = None) -> float | None:
        """Wait for a sample taken after ``since`` (default now) with lag 0; its time."""
        since = time.monotonic() if since is None else since
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = self.first_at_most(0, since)
            if found is not None:
                return found
            time.sleep(0.2)
        return None

    def summary(self) -> dict[str, Any]:
        return {
            "samples": len(self.samples),
            "failed_samples": self.failures,
            "errors": self.errors,
        }


async def _bounded(work: Coroutine[Any, Any, T], seconds: float) -> T:
    """``work``'s result within ``seconds``, else TimeoutError. Unlike ``wait_for`` it does
    not wait for the cancelled work to finish: a client waiting on a broker that is gone
    may take long to notice its cancellation, and the monitor must go on sampling."""
    task = asyncio.ensure_future(work)
    done, _ = await asyncio.wait({task}, timeout=seconds)
    if not done:
        task.cancel()
        raise TimeoutError(f"no answer in {seconds}s")
    return task.result()


async def _close(consumer: AIOKafkaConsumer, admin: AIOKafkaAdminClient) -> None:
    """Stop both clients, waiting at most a few seconds (see :func:`_bounded`)."""
    for stopping in (consumer.stop(), admin.close()):
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await _bounded(stopping, 3.0)
