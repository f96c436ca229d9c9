"""kill -9 of the leading node of three under sustained load, then the node started again.

Topics have replication factor 3 and ``min.insync.replicas=2`` (the workers create theirs
with ``TOPIC_REPLICATION_FACTOR=3``); the load generator produces with acks=all. The node
killed is the one leading the most partitions of the source topics (the lowest id on a
tie). Pass: no acknowledged record lost; while the node is gone, producing goes on at the
planned rates and processing at least at half of what is offered; no worker restarted;
and the tables equal the ground truth once caught up.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient

from chaos.env import kill_broker, replication, start, workdir
from chaos.lag import SOURCES
from chaos.load import LoadLevel
from chaos.session import Session, through_a_broker_fault
from tests.support.kafka import LocalKafka

GUARANTEE = "exactly_once"


def run(
    kafka: LocalKafka, level: LoadLevel, down_s: float = 30.0, workers: int = 2
) -> dict[str, Any]:
    work = workdir("broker-loss")
    session = Session(kafka, level, work, active_s=down_s + 30.0, seed=5, replication=3)
    return through_a_broker_fault(
        session,
        work,
        workers,
        300.0,
        lambda started: _fault(kafka, session, down_s),
        TOPIC_REPLICATION_FACTOR="3",
        PROCESSING_GUARANTEE=GUARANTEE,
    )


def _fault(kafka: LocalKafka, session: Session, down_s: float) -> dict[str, Any]:
    monitor = session.monitor
    load = session.start_load()
    time.sleep(8.0)
    leaders = asyncio.run(_leaders(kafka.bootstrap))
    node = min(leaders, key=lambda n: (-leaders[n], n))
    before = load.figures
    killed_at = time.monotonic()
    lag_before = monitor.lag_at(killed_at)
    killed_pid = kill_broker(kafka, node)
    time.sleep(down_s)
    during = load.figures
    back_at = time.monotonic()
    start(kafka)
    restarted = time.monotonic()
    time.sleep(8.0)
    session.pause()
    paused = time.monotonic()
    settled = session.settle()
    rates = {
        t: monitor.processed(t, killed_at + 5.0, back_at) for t in ("text-lines", "item-events")
    }
    back = monitor.first_at_most(lag_before or 0, restarted)
    return {
        "brokers": kafka.brokers,
        "replication_factor": replication(kafka.bootstrap, _replicated_topics()),
        "leaders_before_kill": {str(n): c for n, c in sorted(leaders.items())},
        "killed_node": node,
        "killed_pid": killed_pid,
        "broker_down_s": down_s,
        "acked_while_down": during.acked_total - before.acked_total,
        "offered_while_down": during.since(before),
        "processed_while_down": {t: r[0] if r else None for t, r in rates.items()},
        "processed_lines_per_s_while_down": _rate(rates["text-lines"]),
        "processed_events_per_s_while_down": _rate(rates["item-events"]),
        "node_restart_s": round(restarted - back_at, 1),
        "lag_before_kill": lag_before,
        "peak_lag": monitor.peak_lag(killed_at, settled.caught_up_at or time.monotonic()),
        "back_to_lag_before_s": None
        if back is None or back > paused
        else round(back - restarted, 1),
        "drain_after_pause_s": settled.drain_s,
        "drift": settled.drift.as_dict(),
        **session.losses(),
    }


def _rate(found: tuple[int, float] | None) -> float | None:
    return None if found is None or found[1] <= 0 else round(found[0] / found[1])


def _replicated_topics() -> list[str]:
    return [*SOURCES, "streamstate-word_counts-changelog", "streamstate-inventory-changelog"]


async def _leaders(bootstrap: str) -> Counter[int]:
    """How many partitions of the source topics each node leads."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        described = await admin.describe_topics(list(SOURCES))
    finally:
        await admin.close()
    return Counter(p["leader"] for topic in described for p in topic["partitions"])
