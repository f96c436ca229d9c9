"""Prometheus metrics of a worker.

Counters and histograms that code increments live in :data:`REGISTRY`; figures that
faust already keeps (consumer positions, restore progress, dead letters) are read when
``/metrics`` is scraped, by :class:`WorkerCollector`, so the hot paths pay nothing.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from tables.membership import WorkerView

REGISTRY = CollectorRegistry(auto_describe=True)

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


def _safe(call: Any, default: Any = None) -> Any:
    try:
        return call()
    except Exception:  # faust raises various errors before the first assignment
        return default


def window_drops(steps: Mapping[str, int]) -> CounterMetricFamily:
    """The records windowed aggregations left out, from the engine's step counts
    (``<topology>.<step>.late`` and ``.expired``)."""
    dropped = CounterMetricFamily(
        "streamstate_window_records_dropped",
        "Records a windowed aggregation left out of a window, by step (topology.step) "
        "and reason: later than the window's grace (late, once per window missed), or "
        "for a window past its retention (expired).",
        labels=["step", "reason"],
    )
    for name, n in sorted(steps.items()):
        step, _, reason = name.rpartition(".")
        if reason in ("late", "expired"):
            dropped.add_metric([step, reason], n)
    return dropped


class WorkerCollector(Collector):
    """Reads the worker's own bookkeeping at scrape time."""

    def __init__(self, worker: WorkerView) -> None:
        self.worker = worker

    def collect(self) -> Iterator[Any]:
        engine = self.worker.engine
        yield from self._engine(engine)
        yield from self._consumer_lag(engine)
        yield from self._restore()

    def _engine(self, engine: Any) -> Iterator[Any]:
        figures = engine.figures
        events = CounterMetricFamily(
            "streamstate_events_processed",
            "Source records each pipeline applied.",
            labels=["agent"],
        )
        for name, n in sorted(figures.events.items()):
            events.add_metric([name], n)
        yield events
        sent = CounterMetricFamily(
            "streamstate_dlq_records",
            "Records sent to a dead-letter topic, by source topic.",
            labels=["source"],
        )
        for source, n in sorted(figures.dead_letters.items()):
            sent.add_metric([source], n)
        yield sent
        failed = CounterMetricFamily(
            "streamstate_failed_records",
            "Records whose processing raised (dead-lettered with the exception), by pipeline.",
            labels=["agent"],
        )
        for name, n in sorted(figures.failed_records.items()):
            failed.add_metric([name], n)
        yield failed
        yield CounterMetricFamily(
            "streamstate_batch_cycles", "Batch cycles the engine completed.", value=figures.cycles
        )
        yield GaugeMetricFamily(
            "streamstate_engine_failed",
            "1 once a store failed: the worker processes nothing until it is restarted.",
            value=int(engine.failure is not None),
        )
        yield CounterMetricFamily(
            "streamstate_batch_cycle_seconds",
            "Time spent in batch cycles, all together.",
            value=figures.cycle_seconds,
        )
        refused = CounterMetricFamily(
            "streamstate_refused_records",
            "Input records sent to a dead-letter topic because Kafka refused (or would "
            "refuse) a record they made, by source topic and Kafka's error.",
            labels=["source", "error"],
        )
        for (source, error), n in sorted(figures.refused_records.items()):
            refused.add_metric([source, error], n)
        yield refused
        retries = CounterMetricFamily(
            "streamstate_cycle_retries",
            "Attempts at a cycle after a failed one: at once after a refusal (refusal), "
            "or scheduled after a backoff (backoff).",
            labels=["cause"],
        )
        for cause, n in sorted(figures.retries.items()):
            retries.add_metric([cause], n)
        yield retries
        yield window_drops(figures.steps)
        yield from self._stalled(engine)

    def _stalled(self, engine: Any) -> Iterator[Any]:
        stalled = GaugeMetricFamily(
            "streamstate_partition_stalled",
            "1 for a partition that cannot advance: its last cycle failed (it is tried "
            "again after a backoff) or its cycle has waited on Kafka for 10 s or more.",
            labels=["partition", "error"],
        )
        seconds = GaugeMetricFamily(
            "streamstate_partition_stalled_seconds",
            "How long a stalled partition has not advanced.",
            labels=["partition"],
        )
        offsets = GaugeMetricFamily(
            "streamstate_stalled_input_offset",
            "The input offset a stalled partition is stuck at (the next one to apply).",
            labels=["topic", "partition"],
        )
        for report in _safe(engine.stalled, []):
            partition = str(report["partition"])
            stalled.add_metric([partition, report["error"]], 1)
            seconds.add_metric([partition], report["stalled_s"])
            for topic, offset in report["inputs"].items():
                if offset is not None:
                    offsets.add_metric([topic, partition], offset)
        yield stalled
        yield seconds
        yield offsets

    def _consumer_lag(self, engine: Any) -> Iterator[Any]:
        lag = GaugeMetricFamily(
            "streamstate_consumer_lag",
            "Records between the end of an assigned source partition and its task's "
            "checkpoint (the next offset to apply).",
            labels=["topic", "partition"],
        )
        membership = self.worker.membership
        highwaters = {}
        assignment = membership.assignment()
        for tp in assignment.actives if assignment is not None else ():
            if tp.topic in engine.topics:
                highwater = membership.highwater(tp)
                if highwater is not None:
                    highwaters[(tp.topic, tp.partition)] = highwater
        for tp, behind in sorted(engine.lag(highwaters).items()):
            lag.add_metric([tp.topic, str(tp.partition)], behind)
        yield lag

    def _restore(self) -> Iterator[Any]:
        membership = self.worker.membership
        stats = _safe(membership.restore_stats)
        remaining = GaugeMetricFamily(
            "streamstate_restore_remaining_records",
            "Changelog records an active partition still has to restore.",
            labels=["topic", "partition"],
        )
        found = _safe(membership.restore_remaining, {})
        for tp, n in sorted((found or {}).items()):
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
        yield CounterMetricFamily(
            "streamstate_standby_records_written",
            "Of those, records written as fetched (one write batch per fetched run); the "
            "others went through faust's changelog queue.",
            value=stats.standby_written_records,
        )
