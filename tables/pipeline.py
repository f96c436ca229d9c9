"""Pipelines: what they read, which tables they write, what they produce, and the batch
context their batch function works in.

A pipeline is a pure batch function over plain records plus a declaration. The engine
(``tables/engine.py``) hands it every fetched record of its source topics for one
partition at a time, in a :class:`Batch`; the function reads and writes table values
through :meth:`Batch.table` and produces records with :meth:`Batch.send`. It returns
nothing: the batch collects its table writes and outputs, and the engine makes them
take effect together with the source offsets, as one unit.

Nothing here touches Kafka or faust, so a batch function runs in a unit test over an
in-memory :class:`StorePartition` (or a real RocksDB on ``tmp_path``).
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, Protocol, TypeVar, overload

import orjson
from sortedcontainers import SortedDict

from core.topics import dlq_topic
from core.values import Bytes, ValueType
from tables.windows import AnyWindow

#: Header of a dead-letter record naming why it was refused.
ERROR_HEADER = "error"
#: Header of a dead letter whose record one pipeline's step raised on: that pipeline's
#: name (the other pipelines reading its topic applied the record).
FAILED_PIPELINE_HEADER = "failed-pipeline"


class TP(NamedTuple):
    """A topic partition (equal to aiokafka's and faust's, which are named tuples too)."""

    topic: str
    partition: int


class SourceRecord(Protocol):
    """A fetched record, as aiokafka's ConsumerRecord (or :class:`Record`) has it."""

    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def timestamp(self) -> int: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...


@dataclass(frozen=True, slots=True)
class Record:
    """A plain source record: what tests and in-process sources hand to a pipeline."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int = 0
    headers: tuple[tuple[str, bytes], ...] = ()


class RecordColumns(Sequence[SourceRecord]):
    """Records of one topic partition held as columns (a batch read as Arrow, say): a
    record is built only when one is asked for, and what works a column at a time (the
    parsing, the key and event-time checks) reads ``keys``, ``values`` and
    ``timestamps`` whole. ``make`` builds a record from topic, partition, offset, key,
    value and timestamp."""

    __slots__ = ("keys", "make", "offsets", "partition", "timestamps", "topic", "values")

    def __init__(
        self,
        topic: str,
        partition: int,
        offsets: Sequence[int],
        keys: Sequence[bytes | None],
        values: Sequence[bytes | None],
        timestamps: Sequence[int],
        make: Callable[[str, int, int, bytes | None, bytes | None, int], SourceRecord],
    ) -> None:
        if not len(offsets) == len(keys) == len(values) == len(timestamps):
            raise ValueError("record columns of different lengths")
        self.topic = topic
        self.partition = partition
        self.offsets = offsets
        self.keys = keys
        self.values = values
        self.timestamps = timestamps
        self.make = make

    def __len__(self) -> int:
        return len(self.values)

    @overload
    def __getitem__(self, index: int) -> SourceRecord: ...
    @overload
    def __getitem__(self, index: slice) -> list[SourceRecord]: ...

    def __getitem__(self, index: int | slice) -> SourceRecord | list[SourceRecord]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        return self.make(
            self.topic,
            self.partition,
            self.offsets[index],
            self.keys[index],
            self.values[index],
            self.timestamps[index],
        )

    def __iter__(self) -> Iterator[SourceRecord]:
        return map(
            self.make,
            itertools.repeat(self.topic),
            itertools.repeat(self.partition),
            self.offsets,
            self.keys,
            self.values,
            self.timestamps,
        )


def record_values(records: Sequence[SourceRecord]) -> Sequence[bytes | None]:
    """The values of ``records``, in order."""
    if isinstance(records, RecordColumns):
        return records.values
    return [record.value for record in records]


def record_keys_and_times(
    records: Sequence[SourceRecord],
) -> tuple[Sequence[bytes | None], Sequence[int]]:
    """The keys and the timestamps of ``records``, in order."""
    if isinstance(records, RecordColumns):
        return records.keys, records.timestamps
    return [record.key for record in records], [record.timestamp for record in records]


class Output(NamedTuple):
    """A record a batch produces, serialized (a named tuple: a cycle makes many)."""

    topic: str
    key: bytes | None
    value: bytes | None
    partition: int | None = None
    timestamp_ms: int | None = None
    headers: list[tuple[str, bytes]] | None = None


class StorePartition(Protocol):
    """One partition of a table's store: raw key bytes to raw value bytes, ordered."""

    def get(self, key: bytes) -> bytes | None: ...

    def items(self, start: bytes) -> Iterator[tuple[bytes, bytes]]:
        """Every item from ``start`` on, in key order (internal keys excluded)."""
        ...


def encode(value: Any) -> bytes:
    """A table value as it is stored and changelogged (JSON, as faust's json codec)."""
    return orjson.dumps(value)


def decode(raw: bytes) -> Any:
    return orjson.loads(raw)


class TableValueError(TypeError):
    """A value written to a table has no JSON encoding, so it cannot be stored."""


def unencodable(table: str, key: bytes, error: Exception) -> str:
    """Why a table value cannot be stored: it has no JSON encoding."""
    shown = key.decode("utf-8", "replace")
    return f"table {table}, key {shown!r}: the value has no JSON encoding ({error})"


#: Values a JSON document holds that need no copy.
_SCALARS = frozenset({str, int, float, bool, type(None)})


class _NotPlain(Exception):
    """A value holds something other than dicts, lists and JSON scalars."""


def _plain_copy(value: Any) -> Any:
    kind = type(value)
    if kind is dict or kind is list:
        copied = value.copy()
        # Mostly scalars (a store's skus and their stock): one pass in C tells.
        inner = copied.values() if kind is dict else copied
        if not set(map(type, inner)) <= _SCALARS:
            places = copied.keys() if kind is dict else range(len(copied))
            for place in places:
                item = copied[place]
                if type(item) not in _SCALARS:
                    copied[place] = _plain_copy(item)
        return copied
    if kind in _SCALARS:
        return value
    raise _NotPlain


def fresh_copy(value: Any) -> Any:
    """A copy of a table value that shares nothing mutable with it. A tree of dicts,
    lists and JSON scalars is copied as it is (one ``dict.copy`` per dict: a value of
    thousands of entries costs a fraction of encoding it); anything else goes through its
    encoding (:func:`encode`, :func:`decode`)."""
    try:
        return _plain_copy(value)
    except _NotPlain:
        return decode(encode(value))


T = TypeVar("T")


class _Deleted:
    def __repr__(self) -> str:
        return "DELETED"


DELETED: Any = _Deleted()
_UNREAD: Any = object()
_READ_ONCE: Any = object()


class TableView:
    """One table partition as a batch sees it: the store with the batch's own writes on
    top. Reads see earlier writes of the same batch; nothing reaches the store until the
    engine applies :meth:`changes`.

    A view can be layered on another (:meth:`child`): the engine applies a record on a
    child and merges it (:meth:`merge_into_parent`) or drops it, so one record that
    raises takes back only its own writes.
    """

    def __init__(
        self, name: str, store: StorePartition, *, ordered: bool, parent: TableView | None = None
    ) -> None:
        self.name = name
        self.store = store
        self.ordered = ordered
        self.parent = parent
        self._pending: dict[bytes, Any] = SortedDict() if ordered else {}
        #: key -> (value, its encoding) of values put with put_checked
        self._raw: dict[bytes, tuple[Any, bytes]] = {}
        #: keys this (top-level) view read from the store with get_fresh (see there)
        self._stored: dict[bytes, Any] = {}

    def child(self) -> TableView:
        return TableView(self.name, self.store, ordered=self.ordered, parent=self)

    def _lookup(self, key: bytes) -> Any:
        """The pending value, DELETED, or None when this batch has not written it."""
        view: TableView | None = self
        while view is not None:
            value = view._pending.get(key)
            if value is not None:
                return value
            view = view.parent
        return None

    def get(self, key: bytes) -> Any | None:
        """The value of ``key`` (decoded), or None when absent."""
        pending = self._lookup(key)
        if pending is not None:
            return None if pending is DELETED else pending
        raw = self.store.get(key)
        return None if raw is None else decode(raw)

    def get_fresh(self, key: bytes) -> Any | None:
        """As :meth:`get`, but a value the caller may change in place: a value written
        earlier in the batch belongs to a view that can still be taken back, so it is
        copied, and so is a store value this pass has read before (:meth:`_stored_fresh`).
        A copy is not normalized as an encoding would be: a NaN stays NaN until stored."""
        pending = self._lookup(key)
        if pending is not None:
            return None if pending is DELETED else fresh_copy(pending)
        root = self
        while root.parent is not None:
            root = root.parent
        return root._stored_fresh(key)

    def _stored_fresh(self, key: bytes) -> Any | None:
        """The store's value of ``key``, decoded for the caller alone. The first read of
        a key in a view decodes it; a key read again (its batch applied again, smaller,
        after a refusal) is decoded once more and kept, and each later read gets a copy,
        which costs far less than decoding a large value again."""
        kept = self._stored.get(key, _UNREAD)
        if kept is _UNREAD:
            self._stored[key] = _READ_ONCE
            raw = self.store.get(key)
            return None if raw is None else decode(raw)
        if kept is _READ_ONCE:
            raw = self.store.get(key)
            kept = self._stored[key] = None if raw is None else decode(raw)
        return None if kept is None else fresh_copy(kept)

    def put(self, key: bytes, value: Any) -> None:
        if value is None:
            raise ValueError(f"{self.name}: a value of None is not storable; use delete()")
        self._pending[key] = value

    def put_checked(self, key: bytes, value: Any) -> None:
        """As :meth:`put`, encoding the value now: a value with no JSON encoding raises
        :class:`TableValueError` in the step that wrote it (whose record then goes to its
        dead-letter topic), and the encoding is not made again when the batch is stored.
        The value must not change afterwards."""
        if value is None:
            raise ValueError(f"{self.name}: a value of None is not storable; use delete()")
        try:
            raw = encode(value)
        except TypeError as error:  # orjson's JSONEncodeError is one
            raise TableValueError(unencodable(self.name, key, error)) from None
        self._pending[key] = value
        self._raw[key] = (value, raw)

    def _encode(self, key: bytes, value: Any) -> bytes:
        kept = self._raw.get(key)
        if kept is not None and kept[0] is value:
            return kept[1]
        return encode(value)

    def delete(self, key: bytes) -> None:
        self._pending[key] = DELETED

    def scan(self, prefix: bytes) -> Iterator[tuple[bytes, Any]]:
        """Items whose key starts with ``prefix``, in key order, this batch's writes
        included (ordered views only)."""
        if not self.ordered:
            raise TypeError(f"{self.name}: scans need an ordered view")
        pending = _merged_pending(self._layers(), prefix)
        yield from _merge(_prefixed(self.store, prefix), pending)

    def _layers(self) -> list[TableView]:
        layers = []
        view: TableView | None = self
        while view is not None:
            layers.append(view)
            view = view.parent
        return layers

    def merge_into_parent(self) -> None:
        """Take this child's writes into its parent."""
        parent = self.parent
        assert parent is not None, "merge_into_parent() on a top-level view"
        parent._pending.update(self._pending)
        self._pending.clear()
        if self._raw:
            parent._raw.update(self._raw)
            self._raw.clear()

    def written(self) -> list[bytes]:
        """The keys this view itself wrote (not its parents)."""
        return list(self._pending)

    def encoded(self, keys: Iterable[bytes]) -> Iterator[tuple[bytes, bytes | None, str | None]]:
        """The values this view itself wrote under ``keys``: (key, encoded value or None
        for a delete, None), or (key, None, why) for a value with no JSON encoding."""
        pending = self._pending
        for key in keys:
            value = pending.get(key)
            if value is None:
                continue
            if value is DELETED:
                yield key, None, None
                continue
            try:
                yield key, self._encode(key, value), None
            except TypeError as error:  # orjson's JSONEncodeError is one
                yield key, None, unencodable(self.name, key, error)

    def changes(self) -> dict[bytes, bytes | None]:
        """The batch's writes, encoded (None deletes). Raises TypeError when a value has
        no JSON encoding (:meth:`checked_changes` names them)."""
        assert self.parent is None, "changes() of a child view"
        if self._raw:
            encoded = self._encode
            return {
                key: None if value is DELETED else encoded(key, value)
                for key, value in self._pending.items()
            }
        return {
            key: None if value is DELETED else encode(value) for key, value in self._pending.items()
        }

    def checked_changes(self) -> tuple[dict[bytes, bytes | None], dict[bytes, str]]:
        """As :meth:`changes`, with the values that have no JSON encoding left out and
        returned apart: key -> why."""
        assert self.parent is None, "checked_changes() of a child view"
        changes: dict[bytes, bytes | None] = {}
        failed: dict[bytes, str] = {}
        for key, value in self._pending.items():
            if value is DELETED:
                changes[key] = None
                continue
            try:
                changes[key] = self._encode(key, value)
            except TypeError as error:
                failed[key] = unencodable(self.name, key, error)
        return changes, failed

    def __len__(self) -> int:
        return len(self._pending)


def _prefixed(store: StorePartition, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
    for key, raw in store.items(prefix):
        if not key.startswith(prefix):
            return
        yield key, raw


def _merged_pending(layers: list[TableView], prefix: bytes) -> list[tuple[bytes, Any]]:
    """The pending writes under ``prefix`` of every layer, the topmost winning, sorted."""
    found: dict[bytes, Any] = {}
    for layer in reversed(layers):  # bottom first: upper layers overwrite
        pending: Any = layer._pending
        for key in pending.irange(minimum=prefix):
            if not key.startswith(prefix):
                break
            found[key] = pending[key]
    return sorted(found.items())


def _merge(
    stored: Iterator[tuple[bytes, bytes]], pending: list[tuple[bytes, Any]]
) -> Iterator[tuple[bytes, Any]]:
    """Stored items and pending writes in key order; a pending write hides the stored
    value of its key, and DELETED hides it altogether."""
    index = 0
    for key, raw in stored:
        while index < len(pending) and pending[index][0] < key:
            pkey, pvalue = pending[index]
            index += 1
            if pvalue is not DELETED:
                yield pkey, pvalue
        if index < len(pending) and pending[index][0] == key:
            pkey, pvalue = pending[index]
            index += 1
            if pvalue is not DELETED:
                yield pkey, pvalue
            continue
        yield key, decode(raw)
    for pkey, pvalue in pending[index:]:
        if pvalue is not DELETED:
            yield pkey, pvalue


TableKind = Literal["table", "windowed", "global"]


@dataclass(frozen=True)
class TableSpec:
    """A table a pipeline writes.

    ``ordered``: batches scan it by prefix. ``queryable``: the HTTP API serves it under
    ``/tables/{name}`` (a pipeline's internal state is not). ``changelog_config``: topic
    configuration of its changelog beyond faust's compaction. ``window``: the windows of
    a windowed table (its keys are :mod:`tables.windows`' window keys). ``value_type``:
    checks a value written from outside the pipeline (a nightly correction).
    """

    name: str
    ordered: bool = False
    queryable: bool = False
    changelog_config: tuple[tuple[str, str], ...] = ()
    window: AnyWindow | None = None
    value_type: ValueType[Any] | None = None

    @property
    def kind(self) -> TableKind:
        return "windowed" if self.window is not None else "table"


@dataclass(frozen=True)
class SourceSpec:
    """A topic a pipeline reads, with what its records must be.

    ``value``: the type every value is parsed with (a record it refuses goes to the
    topic's dead-letter topic). ``key``: the field of the value the record key must
    equal (the topic is partitioned by it; the produce endpoint takes it as the key).
    ``timestamp``: the field holding a record's event time in ms (else the record's
    timestamp). ``tombstones``: a null value is a deletion, not an invalid record.
    """

    topic: str
    value: ValueType[Any] = Bytes
    key: str | None = None
    timestamp: str | None = None
    tombstones: bool = False


#: The batch function of a pipeline.
Process = Callable[["Batch"], None]


@dataclass(frozen=True)
class Pipeline:
    """The declaration of one pipeline.

    ``reads``: its source topics (co-partitioned: a batch holds one partition number of
    each). ``writes``: the tables it writes (it may read them too). ``produces``: the
    topics it sends to (dead-letter topics included). ``cache``: builds the pipeline's
    per-partition cache, kept between batches and dropped whenever a batch of the
    partition fails, so it must hold nothing that the tables do not. ``sources``: the
    declared types of topics it reads (a topic without one takes any bytes).
    ``lookups``: tables it reads but does not write (another pipeline's, same partition).
    ``graph``: its steps, for the console and the docs (:class:`Graph`).
    ``recompute``: how the nightly job recomputes its tables, when it can.
    """

    name: str
    reads: tuple[str, ...]
    process: Process
    writes: tuple[TableSpec, ...] = ()
    produces: tuple[str, ...] = ()
    cache: Callable[[], Any] | None = None
    sources: tuple[SourceSpec, ...] = ()
    lookups: tuple[str, ...] = ()
    graph: Graph | None = None
    recompute: Any = None

    def __post_init__(self) -> None:
        if not self.reads:
            raise ValueError(f"pipeline {self.name}: reads no topic")
        if stray := [s.topic for s in self.sources if s.topic not in self.reads]:
            raise ValueError(f"pipeline {self.name}: declares sources it does not read: {stray}")


@dataclass(frozen=True)
class GraphNode:
    """One node of a pipeline's graph: a topic, a step, a table."""

    id: str
    kind: Literal["source", "step", "repartition", "table", "output", "dlq", "global"]
    label: str


@dataclass(frozen=True)
class Graph:
    """The steps of a pipeline as nodes and edges (ids of :class:`GraphNode`)."""

    nodes: tuple[GraphNode, ...]
    edges: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Context:
    """What the composition root passes to each pipeline module's ``pipelines()``."""

    #: partitions of every topic and table
    partitions: int
    #: largest accepted record value, in bytes
    max_event_bytes: int
    #: how long windowed tables keep a window by default, in ms
    window_retention_ms: int
    #: the app's id: internal topics are named ``<app_id>-<name>-...``
    app_id: str = "streamstate"
    #: the wall clock, in seconds (tests and the test driver set their own)
    clock: Callable[[], float] = time.time
    #: the global tables of the worker by name, filled in before the first batch
    global_tables: Mapping[str, GlobalLookup] = field(default_factory=dict)


class GlobalLookup(Protocol):
    """A global table as a pipeline reads it: each key's value as of an event time."""

    def get(self, key: str, at_ms: int | None = None) -> Any | None:
        """The value of ``key`` as of event time ``at_ms`` (None: the newest)."""
        ...


@dataclass
class Batch:
    """One partition's fetched records of a pipeline's topics, and what it does with them."""

    pipeline: str
    partition: int
    records: Mapping[str, Sequence[SourceRecord]]
    tables: Mapping[str, TableView]
    cache: Any = None
    #: parsed records of this cycle, shared by every pipeline that reads the same topic
    parses: dict[Any, Any] = field(default_factory=dict)
    outputs: list[Output] = field(default_factory=list)
    #: output index -> the timestamp of the input it came from, where a step gave one:
    #: the engine times such an output by it instead of by the batch's latest input
    input_times: dict[int, int] = field(default_factory=dict)
    #: per source topic, the records sent to its dead-letter topic
    dead_lettered: dict[str, int] = field(default_factory=dict)
    #: records through each named step of the pipeline (the console's rates)
    counts: Counter[str] = field(default_factory=Counter)

    def table(self, name: str) -> TableView:
        try:
            return self.tables[name]
        except KeyError:
            raise KeyError(f"pipeline {self.pipeline} does not declare table {name!r}") from None

    def of(self, topic: str) -> Sequence[SourceRecord]:
        """The records of one source topic, in offset order (empty if none)."""
        return self.records.get(topic, ())

    def all_records(self) -> Iterator[SourceRecord]:
        return itertools.chain.from_iterable(self.records.values())

    def parsed(
        self,
        topic: str,
        parse: Callable[[bytes | None, int], T],
        limit: int,
        refused: type[Exception] = ValueError,
    ) -> list[T | Exception]:
        """``parse(record.value, limit)`` of each record of ``topic``, in order (what it
        refused, an exception of type ``refused``, in the record's place), worked out once
        per cycle for all the pipelines that read the topic. Any other exception is
        raised: the batch fails, and the engine applies its records one by one."""
        records = self.of(topic)
        key = (topic, parse, limit)
        cached = self.parses.get(key)
        # Kept with the very record sequence it was worked out for: a batch applied
        # record by record after a failure holds other sequences of the same topic.
        if cached is not None and cached[0] is records:
            found: list[Any] = cached[1]
            return found
        many = getattr(parse, "many", None)
        if many is not None:  # one call for the batch (see core.values.ValueType)
            found = many(record_values(records), limit)
        else:
            found = []
            for raw in record_values(records):
                try:
                    found.append(parse(raw, limit))
                except refused as error:
                    found.append(error)
        self.parses[key] = (records, found)
        return found

    def send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        *,
        partition: int | None = None,
        timestamp_ms: int | None = None,
        headers: list[tuple[str, bytes]] | None = None,
        input_ms: int | None = None,
    ) -> None:
        """Send a record to ``topic``. Without ``timestamp_ms`` the engine times it as
        Kafka Streams does, by its input: ``input_ms`` (the input record's timestamp),
        else the latest input of the batch."""
        if input_ms is not None:
            self.input_times[len(self.outputs)] = input_ms
        self.outputs.append(Output(topic, key, value, partition, timestamp_ms, headers))

    def dead_letter(self, record: SourceRecord, reason: str) -> None:
        """Send ``record``'s original key and value to ``<topic>-dlq``, saying why."""
        self.outputs.append(dead_letter_record(record, reason))
        self.dead_lettered[record.topic] = self.dead_lettered.get(record.topic, 0) + 1


def dead_letter_record(
    record: SourceRecord, reason: str, failed_pipeline: str | None = None
) -> Output:
    """The dead-letter record of a fetched record: its original bytes, and headers that
    say why and where from (and, for a step that raised, in which pipeline)."""
    headers: list[tuple[str, bytes]] = [
        (ERROR_HEADER, reason.encode("utf-8")),
        ("source-topic", record.topic.encode()),
        ("source-partition", str(record.partition).encode()),
        ("source-offset", str(record.offset).encode()),
    ]
    if failed_pipeline is not None:
        headers.append((FAILED_PIPELINE_HEADER, failed_pipeline.encode("utf-8")))
    return Output(dlq_topic(record.topic), record.key, record.value, headers=headers)


def by_topic(records: Iterable[SourceRecord]) -> dict[str, list[SourceRecord]]:
    """Records grouped by topic, each group in the order given."""
    groups: dict[str, list[SourceRecord]] = {}
    for record in records:
        groups.setdefault(record.topic, []).append(record)
    return groups
