"""Prometheus metrics of a worker.

Counters and histograms that code increments live in :data:`REGISTRY`; figures that
faust already keeps (consumer positions, restore progress, dead letters) are read when
``/metrics`` is scraped, by :class:`WorkerCollector`, so the hot paths pay nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import faust
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

REGISTRY = CollectorRegistry(auto_describe=True)

EVENTS_PROCESSED = Counter(
    "streamstate_events_processed",
    "Events handed to each agent's stream.",
    ["agent"],
    registry=REGISTRY,
)
QUERY_LATENCY = Histogram(
    "streamstate_query_latency_seconds",
    "Latency of HTTP queries, by route template and the replica that answered.",
    ["route", "replica"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
    registry=REGISTRY,
)
FORWARDS = Counter(
    "streamstate_forwards",
    "Reads forwarded to a peer, by purpose (owner, fallback, scan, metadata) and outcome.",
    ["purpose", "outcome"],
    registry=REGISTRY,
)


def count_events(agent: str, n: int = 1) -> None:
    """Count events an agent processed outside a faust stream (batched paths)."""
    EVENTS_PROCESSED.labels(agent=agent).inc(n)


class AgentEventCounter(faust.Sensor):
    """faust sensor counting the events each agent's stream delivers."""

    def on_stream_event_in(self, tp: Any, offset: int, stream: Any, event: Any) -> None:
        EVENTS_PROCESSED.labels(agent=getattr(stream, "prefix", "") or "stream").inc()


def _safe(call: Any, default: Any = None) -> Any:
    try:
        return call()
    except Exception:  # faust raises various errors before the first assignment
        return default


class WorkerCollector(Collector):
    """Reads the worker's own bookkeeping at scrape time."""

    def __init__(self, worker: Any) -> None:
        self.worker = worker

    def collect(self) -> Iterator[Any]:
        yield from self._consumer_lag()
        yield from self._restore()
        yield from self._dead_letters()

    def _consumer_lag(self) -> Iterator[Any]:
        lag = GaugeMetricFamily(
            "streamstate_consumer_lag",
            "Records between the end of an assigned source partition and the committed offset.",
            labels=["topic", "partition"],
        )
        consumer = _safe(lambda: self.worker.consumer)
        for tp in sorted(_safe(lambda: consumer.assignment(), set()) or set()):
            if tp.topic.endswith("-changelog"):
                continue  # restore and standby progress are reported on their own
            highwater = _safe(lambda tp=tp: consumer.highwater(tp))
            committed = _safe(lambda tp=tp: consumer._committed_offset.get(tp))
            if highwater is None or highwater < 0:
                continue
            lag.add_metric([tp.topic, str(tp.partition)], max(0, highwater - (committed or 0)))
        pipeline = getattr(self.worker, "pipeline", None)
        for source in getattr(pipeline, "direct", ()):
            for tp, behind in sorted(_safe(source.lag, {}).items()):
                lag.add_metric([tp.topic, str(tp.partition)], behind)
        yield lag

    def _restore(self) -> Iterator[Any]:
        recovery = _safe(lambda: self.worker.tables.recovery)
        stats = getattr(recovery, "stats", None)
        remaining = GaugeMetricFamily(
            "streamstate_restore_remaining_records",
            "Changelog records an active partition still has to restore.",
            labels=["topic", "partition"],
        )
        for tp, n in sorted((_safe(recovery.active_remaining, {}) or {}).items()):
            remaining.add_metric([tp.topic, str(tp.partition)], max(0, n))
        yield remaining
        if stats is None:
            return
        yield GaugeMetricFamily(
            "streamstate_restore_in_progress", "1 while a restore runs.", int(stats.in_progress)
        )
        yield CounterMetricFamily(
            "streamstate_restores", "Restores completed.", value=stats.restores
        )
        yield GaugeMetricFamily(
            "streamstate_restore_last_duration_seconds",
            "Duration of the last completed restore.",
            value=stats.last_duration_s or 0.0,
        )
        yield CounterMetricFamily(
            "streamstate_restore_duration_seconds",
            "Time spent restoring, all restores together.",
            value=stats.total_duration_s,
        )
        records = CounterMetricFamily(
            "streamstate_restore_records",
            "Changelog records restored into active partitions, by table.",
            labels=["table"],
        )
        for table, n in sorted(stats.records_by_table.items()):
            records.add_metric([table], n)
        yield records
        yield CounterMetricFamily(
            "streamstate_standby_records",
            "Changelog records applied to standby partitions.",
            value=stats.standby_records,
        )

    def _dead_letters(self) -> Iterator[Any]:
        sent = CounterMetricFamily(
            "streamstate_dlq_records",
            "Records sent to a dead-letter topic, by source topic.",
            labels=["source"],
        )
        pipeline = getattr(self.worker, "pipeline", None)
        dead_letters = getattr(pipeline, "dead_letters", None)
        for source, n in sorted(getattr(dead_letters, "sent", {}).items()):
            sent.add_metric([source], n)
        yield sent
