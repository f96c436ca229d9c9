"""Restores: a bulk path for long changelog tails, and their accounting.

faust's Recovery service restores the active partitions of every table after each
rebalance, one record at a time through its changelog queue (a few thousand records per
second). :class:`TrackedRecovery` first reads the changelog partitions that are far
behind with a consumer of its own, in large fetches, and writes each fetched run of a
partition as one RocksDB write batch that also carries the partition's persisted
changelog offset (so a kill -9 in the middle leaves a consistent prefix). faust's own
recovery then starts from that offset and only reads what is left, usually nothing.
The bulk read stops at the highwater faust measured for the same recovery; it is
abandoned (faust's path takes over from the last written batch) on a new rebalance, on
stop, or when its time budget runs out.

It also times each restore and counts the records applied, logs one line per restore
and keeps the figures for ``/ready`` and ``/metrics``.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import Counter
from collections.abc import Iterable, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka import TopicPartition as KafkaTP
from faust.tables import TableManager
from faust.tables.recovery import Recovery
from faust.types import TP
from rocksdict import WriteBatch

logger = logging.getLogger(__name__)


@dataclass
class RestoreStats:
    """Figures of the restores of this worker process."""

    restores: int = 0
    in_progress: bool = False
    started_at: float | None = None
    last_duration_s: float | None = None
    last_records: int = 0
    total_records: int = 0
    total_duration_s: float = 0.0
    records_by_table: Counter[str] = field(default_factory=Counter)
    standby_records: int = 0
    bulk_records: int = 0
    bulk_duration_s: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "restores": self.restores,
            "in_progress": self.in_progress,
            "last_duration_s": self.last_duration_s,
            "last_records": self.last_records,
            "total_records": self.total_records,
            "records_by_table": dict(self.records_by_table),
            "standby_records": self.standby_records,
            "bulk_records": self.bulk_records,
            "bulk_duration_s": self.bulk_duration_s,
        }


def bulk_plan(
    starts: Mapping[TP, int | None], highwaters: Mapping[TP, int | None], min_records: int
) -> dict[TP, tuple[int, int]]:
    """The partitions worth a bulk read: ``tp -> (first offset, end offset)``.

    ``starts`` are faust's last applied changelog offsets (``-1`` or ``None``: nothing
    applied); ``highwaters`` are faust's highwaters (the last offset, ``-1`` for an
    empty partition). A partition qualifies when at least ``min_records`` offsets lie
    between the two.
    """
    plan: dict[TP, tuple[int, int]] = {}
    for tp, highwater in highwaters.items():
        if highwater is None or highwater < 0:
            continue
        start = starts.get(tp)
        first = 0 if start is None or start < 0 else start + 1
        end = highwater + 1
        if end - first >= max(min_records, 1):
            plan[tp] = (first, end)
    return plan


def write_run(store: Any, partition: int, records: Iterable[Any], last_offset: int) -> int:
    """Write one fetched run of changelog records and the persisted offset atomically.

    Keys and values are the changelog's bytes, as faust's ``apply_changelog_batch``
    writes them; a ``None`` value (tombstone) deletes. Returns the number of records.
    """
    batch = WriteBatch(raw_mode=True)
    count = 0
    for record in records:
        if record.key is None:
            continue
        if record.value is None:
            batch.delete(record.key)
        else:
            batch.put(record.key, record.value)
        count += 1
    batch.put(store.offset_key, str(last_offset).encode())
    store._db_for_partition(partition).write(batch)
    return count


class TrackedRecovery(Recovery):
    """faust's Recovery with a bulk path for long tails, timing and counting restores."""

    #: Partitions fewer records behind than this are left to faust's own restore.
    bulk_min_records = 2_000
    #: Records per fetch of the bulk consumer.
    bulk_max_records = 20_000
    #: Share of ``broker_request_timeout`` (faust's limit on this step) the bulk read may use.
    bulk_budget_share = 0.6

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stats = RestoreStats()
        self._records_now = 0
        #: (generation, records, start) of this round's bulk read: faust calls
        #: ``_set_recovery_started`` again after it, which must not reset them.
        self._bulk_carry: tuple[int, int, float | None] | None = None
        self._ends: AIOKafkaConsumer | None = None

    def count(self, table_name: str, *, active: bool) -> None:
        """Called once per changelog record that recovery hands to a table."""
        if active:
            self._records_now += 1
            self.stats.records_by_table[table_name] += 1
        else:
            self.stats.standby_records += 1

    async def _build_offsets(self, consumer: Any, tps: Any, destination: Any, title: str) -> None:
        await super()._build_offsets(consumer, tps, destination, title)
        if title == "active" and tps:
            await self._bulk_restore(destination)

    async def _build_highwaters(
        self, consumer: Any, tps: Any, destination: Any, title: str
    ) -> None:
        """Under exactly_once, highwaters from the broker's last stable offsets.

        faust takes them from the consumer's last fetch response there, which knows
        nothing of a partition not fetched since it was assigned: its highwater reads -1,
        so a newly assigned partition is "restored" without reading a record (its table
        left empty) or, holding a standby copy, crashes the worker with ConsistencyError.
        """
        if not self.app.in_transaction or not tps:
            await super()._build_highwaters(consumer, tps, destination, title)
            return
        try:
            helper = await self._ends_consumer()
            ends = await helper.end_offsets([KafkaTP(tp.topic, tp.partition) for tp in tps])
        except Exception as exc:  # the broker did not answer: faust's own figures, as before
            logger.warning("last stable offsets unavailable (%r): using faust's highwaters", exc)
            await super()._build_highwaters(consumer, tps, destination, title)
            return
        destination.clear()
        for tp in tps:
            end = ends.get(KafkaTP(tp.topic, tp.partition))
            destination[tp] = end - 1 if end else -1
        logger.info(
            "%s highwaters (last stable offsets - 1) of %d changelog partitions: %d records",
            title,
            len(tps),
            sum(v + 1 for v in destination.values()),
        )

    async def _ends_consumer(self) -> AIOKafkaConsumer:
        """A ``read_committed`` consumer of the recovery's own, for end offsets."""
        if self._ends is None:
            consumer = self._reader()
            await consumer.start()
            self._ends = consumer
        return self._ends

    async def on_stop(self) -> None:
        await super().on_stop()
        if self._ends is not None:
            with contextlib.suppress(Exception):
                await self._ends.stop()
            self._ends = None

    def _reader(self, **options: Any) -> AIOKafkaConsumer:
        """A consumer outside the group that reads committed records only."""
        return AIOKafkaConsumer(
            bootstrap_servers=self._bootstrap(),
            group_id=None,
            enable_auto_commit=False,
            isolation_level="read_committed",
            **options,
        )

    def _bootstrap(self) -> str:
        settings = getattr(self.app, "settings", None)
        if settings is not None:
            return str(settings.bootstrap_servers)
        return ",".join(f"{u.host}:{u.port or 9092}" for u in self.app.conf.broker)

    def _bulk_tables(self) -> dict[TP, Any]:
        """Active changelog partitions whose table keeps its data in RocksDB."""
        tables: dict[TP, Any] = {}
        for tp in self.active_tps:
            table = self.tp_to_table.get(tp)
            store = getattr(table, "data", None)
            if (
                store is not None
                and hasattr(store, "_db_for_partition")
                and getattr(store, "use_rocksdict", False)
            ):
                tables[tp] = table
        return tables

    async def _bulk_restore(self, offsets: MutableMapping[TP, Any]) -> None:
        tables = self._bulk_tables()
        highwaters = {tp: self.active_highwaters.get(tp) for tp in tables}
        settings = getattr(self.app, "settings", None)
        min_records = getattr(settings, "restore_bulk_min_records", self.bulk_min_records)
        if self.app.in_transaction:
            # faust's own path ends a transactional changelog only after two 5 s waits
            # (the commit marker at its end is never delivered as a record).
            min_records = 1
        plan = bulk_plan({tp: offsets.get(tp) for tp in tables}, highwaters, min_records)
        if not plan:
            return
        budget = float(self.app.conf.broker_request_timeout) * self.bulk_budget_share
        started = time.monotonic()
        consumer = self._reader(
            max_partition_fetch_bytes=16 * 1024 * 1024, fetch_max_bytes=64 * 1024 * 1024
        )
        read = 0
        try:
            await consumer.start()
            remaining = {
                KafkaTP(tp.topic, tp.partition): (tp, end) for tp, (_, end) in plan.items()
            }
            consumer.assign(list(remaining))
            for ktp, (tp, _) in remaining.items():
                consumer.seek(ktp, plan[tp][0])
            while remaining:
                if self.should_stop or self.signal_recovery_start.is_set():
                    logger.info("bulk restore abandoned: rebalance or stop")
                    return
                if time.monotonic() - started > budget:
                    logger.info("bulk restore stopped at its %.0f s budget", budget)
                    return
                fetched = await consumer.getmany(timeout_ms=500, max_records=self.bulk_max_records)
                for ktp, records in fetched.items():
                    entry = remaining.get(ktp)
                    if entry is None:
                        continue
                    tp, end = entry
                    run = [r for r in records if r.offset < end]
                    if run:
                        table = tables[tp]
                        n = write_run(table.data, tp.partition, run, run[-1].offset)
                        offsets[tp] = run[-1].offset
                        read += n
                        self._records_now += n
                        self.stats.records_by_table[table.name] += n
                for ktp, (tp, end) in list(remaining.items()):
                    position = await consumer.position(ktp)
                    if position >= end:
                        # Only transaction markers (or nothing) may lie past the last
                        # record written: everything below ``end`` has been applied.
                        last = end - 1
                        if offsets.get(tp) != last:
                            write_run(tables[tp].data, tp.partition, (), last)
                            offsets[tp] = last
                        del remaining[ktp]
        finally:
            elapsed = time.monotonic() - started
            self.stats.bulk_records += read
            self.stats.bulk_duration_s += elapsed
            rate = read / elapsed if elapsed > 0 else 0.0
            logger.info(
                "bulk restore: %d changelog records of %d partitions in %.3f s (%.0f records/s)",
                read,
                len(plan),
                elapsed,
                rate,
            )
            self._bulk_carry = (self._generation_id, self._records_now, self.stats.started_at)
            with contextlib.suppress(Exception):
                await consumer.stop()

    def _set_recovery_started(self) -> None:
        super()._set_recovery_started()
        carry, self._bulk_carry = self._bulk_carry, None
        self.stats.in_progress = True
        if carry is not None and carry[0] == self._generation_id:
            _, self._records_now, self.stats.started_at = carry
            return
        self._records_now = 0
        self.stats.started_at = time.monotonic()

    def _set_recovery_ended(self) -> None:
        super()._set_recovery_ended()
        if not self.stats.in_progress or self.stats.started_at is None:
            return
        elapsed = time.monotonic() - self.stats.started_at
        stats = self.stats
        stats.in_progress = False
        stats.restores += 1
        stats.last_duration_s = elapsed
        stats.last_records = self._records_now
        stats.total_records += self._records_now
        stats.total_duration_s += elapsed
        rate = self._records_now / elapsed if elapsed > 0 else 0.0
        logger.info(
            "restore %d done: %d changelog records in %.3f s (%.0f records/s) for %d partitions",
            stats.restores,
            self._records_now,
            elapsed,
            rate,
            len(self.active_tps),
        )


class StreamstateTableManager(TableManager):
    """TableManager whose recovery is a :class:`TrackedRecovery`.

    faust's manager sleeps one second at start so that tables declared late can still
    register; every table here is declared when the app is created, so it starts at once.
    """

    async def on_start(self) -> None:
        if not self.should_stop:
            await self._update_channels()
            await self.recovery.start()

    @property
    def recovery(self) -> TrackedRecovery:
        if self._recovery is None:
            self._recovery = TrackedRecovery(self.app, self, beacon=self.beacon, loop=self.loop)
        return self._recovery  # type: ignore[return-value]
