"""Global tables: a whole topic kept by every worker, each key with its recent values.

faust's GlobalTable documents an endless recovery loop with several workers, so a global
table is kept another way: each worker runs its own group-less consumer over every
partition of the topic and keeps the records in a RocksDB database of its own, with the
next offset of each partition stored in the same write batch, so a restart resumes from
where it stopped.

Each key keeps its recent versions with their record timestamps, and a join reads the
version whose timestamp is the latest at or before the joining record's event time: the
result does not depend on how far the table's consumer happens to have read, and the
nightly job applies the same rule to the retained topic. A null value deletes the key
from then on. Invalid records are left out here; one pipeline in the group sends them to
the topic's dead-letter topic.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition
from mode import Service
from rocksdict import Options, Rdict, WriteBatch

from core.admin import partitions_of
from core.values import InvalidEvent, ValueType, check_key, required_field

logger = logging.getLogger(__name__)

_VALUE = b"v:"
_OFFSET = b"o:"
#: Keys whose versions are kept decoded in memory (every join looks its key up).
CACHED_KEYS = 1 << 16

#: ``[timestamp_ms, offset, raw value text or None]``, oldest first
Versions = list[list[Any]]


@dataclass(frozen=True)
class GlobalSpec:
    """What a global table is: its name, its topic, and how its records are checked."""

    name: str
    topic: str
    value_type: ValueType[Any]
    key: str | None = None
    versions: int = 32


def pick_version(versions: Versions, at_ms: int | None) -> Any | None:
    """The stored value of the latest version at or before ``at_ms`` (None: the newest);
    None when there is none then or it was deleted."""
    chosen: Any | None = None
    for timestamp, _offset, value in versions:
        if at_ms is not None and timestamp > at_ms:
            break
        chosen = value
    return chosen


def checked(spec: GlobalSpec, key: bytes | None, raw: bytes | None, max_bytes: int) -> Any:
    """The stored form of a record (its text, None for a deletion), or InvalidEvent."""
    if key is None:
        raise InvalidEvent("key: missing; a global table is keyed")
    if raw is None:
        return None
    value = spec.value_type.parse(raw, max_bytes)
    if spec.key is not None:
        check_key(key, str(required_field(value, spec.key)), spec.key)
    return raw.decode("utf-8")


def add_version(
    versions: Versions, timestamp: int, offset: int, stored: Any, keep: int
) -> Versions:
    versions.append([timestamp, offset, stored])
    versions.sort(key=lambda v: (v[0], v[1]))
    return versions[-keep:]


class Lookups:
    """Reads of a global table's versions, decoded with its value type (each stored
    value once: joins look the same few keys up again and again)."""

    spec: GlobalSpec
    _decoded: dict[str, Any]

    def versions(self, key: str) -> Versions:
        raise NotImplementedError

    def get(self, key: str, at_ms: int | None = None) -> Any | None:
        """The value of ``key`` as of event time ``at_ms`` (None: the newest)."""
        stored = pick_version(self.versions(key), at_ms)
        if stored is None:
            return None
        decoded = self._decoded.get(stored)
        if decoded is None:
            if len(self._decoded) >= CACHED_KEYS:
                self._decoded.clear()
            decoded = self._decoded[stored] = self.spec.value_type.parse(
                stored.encode("utf-8"), 1 << 62
            )
        return decoded

    def document(self, key: str) -> Any | None:
        """The newest value of ``key`` as a JSON document (what the API answers)."""
        stored = pick_version(self.versions(key), None)
        return None if stored is None else orjson.loads(stored)


class MemoryGlobalTable(Lookups):
    """A global table in memory (the test driver's, and the nightly job's)."""

    def __init__(self, spec: GlobalSpec, max_bytes: int = 1 << 62) -> None:
        self.spec = spec
        self._decoded = {}
        self.max_bytes = max_bytes
        self.data: dict[str, Versions] = {}

    def apply(self, key: bytes | None, raw: bytes | None, timestamp: int, offset: int) -> bool:
        """Take one record; False when it is invalid (left out)."""
        try:
            stored = checked(self.spec, key, raw, self.max_bytes)
        except InvalidEvent:
            return False
        assert key is not None
        name = key.decode("utf-8")
        self.data[name] = add_version(
            self.data.get(name, []), timestamp, offset, stored, self.spec.versions
        )
        return True

    def versions(self, key: str) -> Versions:
        return self.data.get(key, [])

    def keys(self) -> list[str]:
        return sorted(k for k in self.data if self.get(k) is not None)


class GlobalTableService(Service, Lookups):
    """A worker-local copy of every partition of a global table's topic."""

    def __init__(
        self, spec: GlobalSpec, *, bootstrap: str, path: Path, max_bytes: int, **kwargs: Any
    ) -> None:
        self.spec = spec
        self._decoded = {}
        self.bootstrap = bootstrap
        self.path = path
        self.max_bytes = max_bytes
        self._db: Rdict | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._caught_up = asyncio.Event()
        self._targets: dict[TopicPartition, int] = {}
        #: decoded versions by key, dropped for a key whenever a record of it is applied
        self._cache: dict[str, Versions] = {}
        #: per partition, the next offset not applied (what the database stores)
        self._applied: dict[int, int] = {}
        #: called with the partition after each batch of its records is applied
        self.listeners: list[Callable[[int], None]] = []
        #: called with the partition and the keys (as in the topic) a batch of its
        #: records changed
        self.change_listeners: list[Callable[[int, list[bytes]], None]] = []
        self.records_applied = 0
        self.records_invalid = 0
        Service.__init__(self, **kwargs)

    @property
    def label(self) -> str:
        return f"global table {self.spec.name}"

    # -- reads ------------------------------------------------------------------------

    def versions(self, key: str) -> Versions:
        """The versions of a key, oldest first (shared: not to be changed)."""
        found = self._cache.get(key)
        if found is not None:
            return found
        if self._db is None:
            return []
        raw = self._db.get(_VALUE + key.encode("utf-8"))
        found = orjson.loads(raw) if raw is not None else []
        if len(self._cache) >= CACHED_KEYS:
            self._cache.clear()
        self._cache[key] = found
        return found

    def keys(self) -> list[str]:
        if self._db is None:
            return []
        found = []
        for key in self._db.keys(from_key=_VALUE):
            assert isinstance(key, bytes)
            if not key.startswith(_VALUE):
                break
            name = key[len(_VALUE) :].decode("utf-8")
            if pick_version(self.versions(name), None) is not None:
                found.append(name)
        return found

    @property
    def caught_up(self) -> bool:
        return self._caught_up.is_set()

    async def wait_caught_up(self) -> None:
        """Wait until the table has read up to the end offsets seen at its start."""
        if not self._caught_up.is_set():
            await self._caught_up.wait()

    def applied(self, partition: int) -> int:
        """The first offset of one partition of the topic whose record this copy does
        not hold (0 before it holds any)."""
        found = self._applied.get(partition)
        if found is None:
            if self._db is None:
                return 0
            found = self._applied[partition] = self._stored_offset(partition)
        return found

    def partition_lag(self, partition: int) -> int | None:
        """Records of one partition not applied yet (None: unknown, before the table's
        consumer has started or fetched that partition)."""
        if self._consumer is None or self._db is None:
            return None
        highwater = self._consumer.highwater(TopicPartition(self.spec.topic, partition))
        if highwater is None:
            return None
        return max(0, int(highwater) - self.applied(partition))

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
            partitions = await partitions_of(self.bootstrap, self.spec.topic)
        tps = [TopicPartition(self.spec.topic, p) for p in partitions]
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, self._stored_offset(tp.partition))
        self._targets = dict(await consumer.end_offsets(tps))
        logger.info(
            "%s: %d partitions of %s, %d records behind",
            self.label,
            len(tps),
            self.spec.topic,
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
                logger.info("%s: caught up (%d records applied)", self.label, self.records_applied)
                self._caught_up.set()

    def _apply(self, partition: int, records: Iterable[Any]) -> None:
        assert self._db is not None
        batch = WriteBatch(raw_mode=True)
        pending: dict[bytes, Versions] = {}
        last = None
        for record in records:
            last = record
            try:
                stored = checked(self.spec, record.key, record.value, self.max_bytes)
            except InvalidEvent:
                self.records_invalid += 1
                continue
            db_key = _VALUE + record.key
            versions = pending.get(db_key)
            if versions is None:
                raw = self._db.get(db_key)
                versions = orjson.loads(raw) if raw is not None else []
            pending[db_key] = add_version(
                versions, record.timestamp, record.offset, stored, self.spec.versions
            )
            self.records_applied += 1
        for db_key, versions in pending.items():
            batch.put(db_key, orjson.dumps(versions))
            self._cache.pop(db_key[len(_VALUE) :].decode("utf-8", "surrogateescape"), None)
        if last is not None:
            batch.put(_OFFSET + str(partition).encode(), str(last.offset + 1).encode())
        self._db.write(batch)
        if last is not None:
            self._applied[partition] = last.offset + 1
            for listener in self.listeners:
                listener(partition)
            if pending and self.change_listeners:
                changed = [db_key[len(_VALUE) :] for db_key in pending]
                for on_change in self.change_listeners:
                    on_change(partition, changed)
