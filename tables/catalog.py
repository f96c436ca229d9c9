"""The ``products`` global table, kept by every worker from the whole compacted topic.

faust's GlobalTable documents an endless recovery loop with several workers, so the
catalogue is built another way: each worker runs its own group-less consumer over every
partition of ``products`` and keeps the records in a RocksDB database of its own, with
the next offset of each partition stored in the same write batch, so a restart resumes
from where it stopped.

Each SKU keeps its recent versions with their record timestamps, and a sale is enriched
with the version whose timestamp is the latest at or before the sale's event time: the
result does not depend on how far the catalogue consumer happens to have read, and the
batch job applies the same rule to the retained topic.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition
from mode import Service
from rocksdict import Options, Rdict, WriteBatch

from core.admin import partitions_of
from core.semantics import InvalidEvent, category_of, check_key, parse_product

logger = logging.getLogger(__name__)

_PRODUCT = b"p:"
_OFFSET = b"o:"
#: Versions kept per SKU; older ones are dropped (enough for the catalogue's slow churn).
MAX_VERSIONS = 32
#: SKUs whose versions are kept decoded in memory (every sale looks its SKU up).
CACHED_SKUS = 1 << 16


def pick_version(versions: list[list[Any]], at_ms: int | None) -> dict[str, Any] | None:
    """The product record of the latest version at or before ``at_ms`` (None: the newest).

    ``versions`` holds ``[timestamp_ms, offset, record or None]``, oldest first; a None
    record is a deletion (a tombstone on the compacted topic).
    """
    chosen: dict[str, Any] | None = None
    for timestamp, _offset, record in versions:
        if at_ms is not None and timestamp > at_ms:
            break
        chosen = record
    return chosen


class ProductCatalog(Service):
    """A worker-local copy of every partition of ``products``."""

    def __init__(self, *, bootstrap: str, topic: str, path: Path, **kwargs: Any) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.path = path
        self._db: Rdict | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._caught_up = asyncio.Event()
        self._targets: dict[TopicPartition, int] = {}
        #: decoded versions by SKU, dropped for a SKU whenever a record of it is applied
        self._cache: dict[str, list[list[Any]]] = {}
        self.records_applied = 0
        self.records_invalid = 0
        super().__init__(**kwargs)

    # -- reads ------------------------------------------------------------------------

    def versions(self, sku: str) -> list[list[Any]]:
        """The versions of a SKU, oldest first (shared: not to be changed)."""
        found = self._cache.get(sku)
        if found is not None:
            return found
        if self._db is None:
            return []
        raw = self._db.get(_PRODUCT + sku.encode("utf-8"))
        found = orjson.loads(raw) if raw is not None else []
        if len(self._cache) >= CACHED_SKUS:
            self._cache.clear()
        self._cache[sku] = found
        return found

    def get(self, sku: str) -> dict[str, Any] | None:
        """The newest record of a SKU, or None."""
        return pick_version(self.versions(sku), None)

    def category_at(self, sku: str, at_ms: int) -> str:
        """The category of ``sku`` as of event time ``at_ms`` ("unknown" if none)."""
        return category_of(pick_version(self.versions(sku), at_ms))

    def keys(self) -> list[str]:
        if self._db is None:
            return []
        found = []
        for key in self._db.keys(from_key=_PRODUCT):
            assert isinstance(key, bytes)
            if not key.startswith(_PRODUCT):
                break
            sku = key[len(_PRODUCT) :].decode("utf-8")
            if self.get(sku) is not None:
                found.append(sku)
        return found

    @property
    def caught_up(self) -> bool:
        return self._caught_up.is_set()

    async def wait_caught_up(self) -> None:
        """Wait until the catalogue has read up to the end offsets seen at its start."""
        if not self._caught_up.is_set():
            await self._caught_up.wait()

    def partition_lag(self, partition: int) -> int | None:
        """Records of one partition the catalogue has not applied yet (None: unknown,
        before the catalogue has started or fetched that partition)."""
        if self._consumer is None or self._db is None:
            return None
        highwater = self._consumer.highwater(TopicPartition(self.topic, partition))
        if highwater is None:
            return None
        return max(0, int(highwater) - self._stored_offset(partition))

    def lag(self) -> int:
        """Records between what was read and the end offsets seen at start."""
        if self._consumer is None:
            return -1
        return sum(
            max(0, end - self._stored_offset(tp.partition)) for tp, end in self._targets.items()
        )

    # -- lifecycle --------------------------------------------------------------------

    async def on_start(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = Rdict(str(self.path), options=Options(raw_mode=True))
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_committed",
        )
        await self._consumer.start()
        self.add_future(self._run())

    async def on_stop(self) -> None:
        if self._consumer is not None:
            await self._consumer.stop()
            self._consumer = None
        if self._db is not None:
            self._db.close()
            self._db = None

    def _stored_offset(self, partition: int) -> int:
        assert self._db is not None
        raw = self._db.get(_OFFSET + str(partition).encode())
        return int(raw) if raw is not None else 0

    async def _assign(self) -> None:
        consumer = self._consumer
        assert consumer is not None
        partitions: list[int] = []
        while not partitions and not self.should_stop:
            partitions = await partitions_of(self.bootstrap, self.topic)
        tps = [TopicPartition(self.topic, p) for p in partitions]
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, self._stored_offset(tp.partition))
        self._targets = dict(await consumer.end_offsets(tps))
        logger.info(
            "catalog: %d partitions of %s, %d records behind",
            len(tps),
            self.topic,
            self.lag(),
        )

    async def _run(self) -> None:
        await self._assign()
        consumer = self._consumer
        while consumer is not None and not self.should_stop:
            batches = await consumer.getmany(timeout_ms=500, max_records=5000)
            for tp, records in batches.items():
                self._apply(tp.partition, records)
            if not self._caught_up.is_set() and self.lag() == 0:
                logger.info("catalog: caught up (%d records applied)", self.records_applied)
                self._caught_up.set()

    def _apply(self, partition: int, records: list[Any]) -> None:
        assert self._db is not None
        batch = WriteBatch(raw_mode=True)
        pending: dict[bytes, list[list[Any]]] = {}
        for record in records:
            if record.key is None:
                self.records_invalid += 1
                continue
            db_key = _PRODUCT + record.key
            if record.value is None:
                product: dict[str, Any] | None = None
            else:
                try:
                    product = parse_product(record.value).model_dump()
                    check_key(record.key, product["sku"], "sku")
                except InvalidEvent:
                    # The products agent sends this record to products-dlq.
                    self.records_invalid += 1
                    continue
            versions = pending.get(db_key)
            if versions is None:
                raw = self._db.get(db_key)
                versions = orjson.loads(raw) if raw is not None else []
            versions.append([record.timestamp, record.offset, product])
            versions.sort(key=lambda v: (v[0], v[1]))
            pending[db_key] = versions[-MAX_VERSIONS:]
            self.records_applied += 1
        for db_key, versions in pending.items():
            batch.put(db_key, orjson.dumps(versions))
            self._cache.pop(db_key[len(_PRODUCT) :].decode("utf-8", "surrogateescape"), None)
        if records:
            next_offset = str(records[-1].offset + 1).encode()
            batch.put(_OFFSET + str(partition).encode(), next_offset)
        self._db.write(batch)
