"""One loaded scenario's instruments: the load, the ground truth, the tables, the lag.

A :class:`Session` creates the project's topics, writes the product catalogue, starts
the load generator process when asked, and, after each pause of the load, reads the
source topics' new records into the truth, waits until the group has caught up (lag 0 on
every topic it reads) and compares the tables with the truth.

When the level asks for it (``LoadLevel.share``), starting the load begins with a
calibration: the generator offers the level's rates (more than the group keeps up with)
for a few seconds and pauses; the group's processing of that backlog, from the first
record to lag 0 on every topic it reads, is what it sustains of lines and item events
together, and the scenario then offers its share of that.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer

from agents.schemas import demo_topic_specs
from chaos.compare import Drift, Tables, drift
from chaos.env import crashes, group, pid
from chaos.lag import LagMonitor
from chaos.load import LoadFigures, LoadLevel, LoadProcess, acked_batches
from chaos.reader import TopicReader
from chaos.truth import Truth
from chaos.workload import MINUTE_MS, product_records
from core.admin import ensure_topics
from tests.support.kafka import LocalKafka
from tests.support.workers import Worker

#: Event time should cover this much over a run: hourly windows roll, sales expire.
EVENT_SPAN_MS = 45 * MINUTE_MS
#: How long the calibration offers its rates, and how long it waits for the group to
#: process them.
CALIBRATION_LOAD_S = 5.0
CALIBRATION_TIMEOUT_S = 180.0


@dataclass(frozen=True)
class ClockPlan:
    """Event time for a run of ``active_s`` seconds of load: at least ten times real time,
    ending a few minutes before the wall clock."""

    start_ms: int
    speed: float

    @classmethod
    def for_run(cls, active_s: float) -> ClockPlan:
        speed = max(10.0, EVENT_SPAN_MS / 1000 / max(active_s, 1.0))
        start = int(time.time() * 1000) - int(speed * active_s * 1000) - 5 * MINUTE_MS
        return cls(start, round(speed, 1))


@dataclass(frozen=True)
class Calibration:
    """What a group processed of a backlog offered above its means, and the level it is
    offered from then on."""

    probe: LoadLevel
    offered_s: float
    lines: int
    events: int
    processed_s: float
    caught_up: bool
    level: LoadLevel

    @property
    def lines_per_s(self) -> float:
        return self.lines / self.processed_s

    @property
    def events_per_s(self) -> float:
        return self.events / self.processed_s

    def as_dict(self) -> dict[str, Any]:
        return {
            "probe": self.probe.as_dict(),
            "offered_s": round(self.offered_s, 1),
            "lines": self.lines,
            "events": self.events,
            "processed_s": round(self.processed_s, 1),
            "caught_up": self.caught_up,
            "sustained_lines_per_s": round(self.lines_per_s),
            "sustained_events_per_s": round(self.events_per_s),
        }


def calibrated(
    probe: LoadLevel, acked: dict[str, int], offered_s: float, processed_s: float, caught_up: bool
) -> Calibration:
    """The calibration of a backlog of ``acked`` records that the group took
    ``processed_s`` to process (from the first record on; up to lag 0 when
    ``caught_up``, else what it committed meanwhile)."""
    lines, events = acked.get("text-lines", 0), acked.get("item-events", 0)
    seconds = max(processed_s, 1e-3)
    level = probe.scaled(
        lines / seconds,
        events / seconds,
        f"{probe.share:.0%} of what the group sustained in this run's calibration "
        f"({lines / seconds:,.0f} lines/s + {events / seconds:,.0f} item events/s: "
        f"{lines:,} lines and {events:,} events offered in {offered_s:.1f} s, processed "
        f"{'to lag 0 ' if caught_up else ''}in {seconds:.1f} s)",
    )
    return Calibration(probe, offered_s, lines, events, seconds, caught_up, level)


@dataclass(frozen=True)
class Settled:
    """The outcome of one comparison after a pause."""

    drift: Drift
    caught_up_at: float | None
    drain_s: float | None
    records_read: int


class Session:
    """The load, truth, tables and lag monitor of one scenario on one cluster."""

    def __init__(
        self,
        kafka: LocalKafka,
        level: LoadLevel,
        work: Path,
        *,
        active_s: float,
        seed: int = 1,
        replication: int = 1,
    ) -> None:
        # aiokafka warns of every retry (a leader not elected yet, a broker away); the
        # figures count what matters.
        logging.getLogger("aiokafka").setLevel(logging.ERROR)
        self.kafka = kafka
        self.level = level
        self.work = work
        self.seed = seed
        calibration_s = CALIBRATION_LOAD_S if level.share is not None else 0.0
        self.clock = ClockPlan.for_run(active_s + calibration_s)
        asyncio.run(ensure_topics(kafka.bootstrap, demo_topic_specs(8, -1), replication))
        asyncio.run(_produce_products(kafka.bootstrap, product_records(self.clock.start_ms)))
        self.truth = Truth()
        self.readers = {
            topic: TopicReader(kafka.bootstrap, topic)
            for topic in ("products", "text-lines", "item-events", "payments")
        }
        self.tables = Tables(kafka.bootstrap)
        self.monitor = LagMonitor(kafka.bootstrap).start()
        self.load: LoadProcess | None = None
        self.calibration: Calibration | None = None
        #: the generator's figures when the scenario's own load began
        self.offered_from: LoadFigures | None = None

    def start_load(self) -> LoadProcess:
        """Start the generator at the session's level, after the calibration when the
        level asks for one."""
        self.load = LoadProcess(
            self.kafka.bootstrap,
            self.level,
            self.work,
            seed=self.seed,
            run_id=f"s{self.seed}",
            clock_start_ms=self.clock.start_ms,
            clock_speed=self.clock.speed,
        )
        if self.level.share is not None:
            self.calibration = self.calibrate(self.load)
            self.level = self.calibration.level
            self.load.rate(self.level)
            self.offered_from = self.load.resume()
        else:
            self.offered_from = self.load.figures
        return self.load

    def calibrate(self, load: LoadProcess) -> Calibration:
        """Offer the level's rates for ``CALIBRATION_LOAD_S``, pause, and time the group
        from the generator's first records until it has processed all of them (the
        generator process takes a while to start: that time is not the group's)."""
        running = load.wait_offering().running_s
        started = time.monotonic() - running
        time.sleep(max(0.0, CALIBRATION_LOAD_S - running))
        offered = load.pause()
        paused = time.monotonic()
        caught_up = self.monitor.wait_caught_up(CALIBRATION_TIMEOUT_S, since=paused)
        if caught_up is not None:
            return calibrated(
                self.level, offered.acked, offered.running_s, caught_up - started, True
            )
        committed = {
            topic: found[0]
            for topic in ("text-lines", "item-events")
            if (found := self.monitor.processed(topic, started, time.monotonic())) is not None
        }
        seconds = time.monotonic() - started
        return calibrated(self.level, committed, offered.running_s, seconds, False)

    def pause(self) -> LoadFigures:
        assert self.load is not None
        return self.load.pause()

    def resume(self) -> None:
        assert self.load is not None
        self.load.resume()

    def refresh_truth(self) -> int:
        """Read the source topics' new records into the truth; how many."""
        handlers = {
            "products": self.truth.add_products,
            "text-lines": self.truth.add_lines,
            "item-events": self.truth.add_events,
            "payments": self.truth.add_payments,
        }
        return sum(self.readers[t].read_new(handle) for t, handle in handlers.items())

    def settle(self, timeout: float = 300.0, attempts: int = 5, drifts: bool = False) -> Settled:
        """With the load paused: truth read, group caught up, tables compared.

        The engine writes a cycle's changelog records before (at_least_once) or with
        (exactly_once) its offsets, so once the offsets are all committed the changelogs
        are final; a few more reads cover a changelog that a broker still has in flight.
        When the tables may drift (``drifts``: at_least_once over-counts after a kill),
        two reads that find the same drift end the wait; otherwise only an exact one does.
        """
        paused = time.monotonic()
        records = self.refresh_truth()
        caught_up = self.monitor.wait_caught_up(timeout, since=paused)
        found = self.compare()
        for _ in range(attempts - 1):
            if found.exact:
                break
            time.sleep(2.0)
            found, before = self.compare(), found
            if drifts and found == before:
                break
        drain = None if caught_up is None else round(caught_up - paused, 1)
        return Settled(found, caught_up, drain, records)

    def compare(self) -> Drift:
        self.tables.refresh()
        return drift(self.truth, self.tables)

    def losses(self) -> dict[str, Any]:
        """Acknowledged batches checked against what the topics hold (read the truth
        first: it tracks the sequence numbers)."""
        assert self.load is not None
        entries = list(acked_batches(self.load.ledger))
        lost = [e for e in entries if not self._holds(e.topic, e.partition, e)]
        return {
            "acked_batches": len(entries),
            "acked_records": sum(e.count for e in entries),
            "acked_but_lost": sum(e.count for e in lost),
            "lost_examples": [e.__dict__ for e in lost[:3]],
            "records_out_of_sequence": sum(r.out_of_sequence for r in self.truth.runs.values()),
        }

    def _holds(self, topic: str, partition: int, entry: Any) -> bool:
        runs = self.truth.runs.get((topic, partition))
        return runs is not None and runs.holds(entry.base_offset, entry.first_seq, entry.count)

    def close(self) -> dict[str, Any]:
        """Stop the load and the monitor; the planned level, the calibration, and what
        was offered from the end of the calibration on (over wall time, stalls
        included)."""
        final = self.load.stop() if self.load is not None else None
        self.monitor.stop()
        figures: dict[str, Any] = {"level": self.level.as_dict()}
        if self.calibration is not None:
            figures["calibration"] = self.calibration.as_dict()
        if final is not None and self.offered_from is not None:
            figures.update(
                **final.since(self.offered_from),
                producer_errors=final.errors,
                event_clock={"start_ms": self.clock.start_ms, "speed": self.clock.speed},
            )
        return figures


async def _produce_products(bootstrap: str, records: Sequence[tuple[bytes, bytes, int]]) -> None:
    """The catalogue, each version with its own record timestamp (its validity)."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True)
    await producer.start()
    try:
        sent = [
            await producer.send("products", value, key=key, timestamp_ms=timestamp)
            for key, value, timestamp in records
        ]
        await asyncio.gather(*sent)
    finally:
        await producer.stop()


def through_a_broker_fault(
    session: Session,
    work: Path,
    workers: int,
    ready_s: float,
    fault: Callable[[list[Worker]], dict[str, Any]],
    **env: str,
) -> dict[str, Any]:
    """``workers`` workers ready under ``env``, then ``fault(workers)`` under the
    session's load; its figures with whether every worker kept its process and agents,
    and the load's figures."""
    try:
        with group(session.kafka, work, **env) as members:
            started = [members.add(f"w{n}") for n in range(workers)]
            for worker in started:
                worker.wait_ready(ready_s)
            pids = [pid(w) for w in started]
            figures = fault(started)
            same = [pid(w) == p and w.alive() for w, p in zip(started, pids, strict=True)]
            figures.update(
                workers=workers,
                workers_same_process=all(same),
                agent_crashes=sum(crashes(w) for w in started),
            )
    finally:
        load = session.close()
    figures["load"] = load
    return figures
