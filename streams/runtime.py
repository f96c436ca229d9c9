"""Running a compiled pipeline over one batch.

A :class:`Runner` is a pipeline's batch function. It works a column at a time: the
records of a step are :class:`Rows`, lists of values and, where a later step needs them,
of record keys, event times and the positions of the source records they came from
(``index``). Each step maps whole lists (``map`` and ``filter`` run the user's function
through the builtins, ``flat_map`` chains the results), so a batch costs one call of the
user's function per record and little else. Then each sink takes effect on the batch:

* ``to``: one output record per value;
* ``apply``: each key's values folded into the table, the key read once and written once;
* ``send``: each key's values combined into one aggregate per batch (or, for an
  aggregation without a merge, kept as they are) and sent to the partition of the
  repartition topic that owns the key, many keys per record.

A user function that raises makes the batch raise: the engine then applies its records
one by one and sends the one that raises to its dead-letter topic.
"""

from __future__ import annotations

import base64
import functools
import operator
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import chain, compress, repeat
from typing import Any

import orjson

from core.topics import partition_for
from core.values import (
    MAX_EVENT_TIME_MS,
    InvalidEvent,
    JsonType,
    Model,
    TextType,
    Typed,
    ValueType,
    check_key,
    event_time,
    required_field,
)
from streams.compile import Plan, Root, Sink, join_tables, state_table
from streams.topology import Aggregation, Node
from tables.join import LEFT, RIGHT, PartitionJoin
from tables.pipeline import Batch, TableView, record_keys_and_times
from tables.windows import (
    AnyWindow,
    Hopping,
    Session,
    Tumbling,
    WindowIndex,
    key_prefix,
    parse_window_range,
    session_key,
    table_key,
)

#: A repartition record holds items until its JSON reaches about this many bytes.
RECORD_BYTES = 256 * 1024
#: Fields of a repartition record: combined aggregates, or values in order.
COMBINED, VALUES = "combined", "values"


class Rows:
    """A step's records as columns (``keys``, ``times``, ``index``: None when no later
    step needs them). ``topic``: the source topic ``index`` points into."""

    __slots__ = ("firsts", "index", "keys", "times", "topic", "values")

    def __init__(
        self,
        values: list[Any],
        keys: list[bytes | None] | None = None,
        times: list[int] | None = None,
        index: list[int] | None = None,
        topic: str | None = None,
        firsts: list[int] | None = None,
    ) -> None:
        self.values = values
        self.keys = keys
        self.times = times
        self.index = index
        self.topic = topic
        #: per record, the start of the first of its hopping windows its grace leaves
        #: open (None: all of them are)
        self.firsts = firsts

    def __len__(self) -> int:
        return len(self.values)

    def select(self, mask: Sequence[Any]) -> Rows:
        def pick(column: list[Any] | None) -> list[Any] | None:
            return None if column is None else list(compress(column, mask))

        return Rows(
            list(compress(self.values, mask)),
            pick(self.keys),
            pick(self.times),
            pick(self.index),
            self.topic,
            pick(self.firsts),
        )

    def expand(self, parts: list[list[Any]]) -> Rows:
        """Each record repeated once per value of its part (``flat_map``)."""
        counts = list(map(len, parts))

        def spread(column: list[Any] | None) -> list[Any] | None:
            return (
                None if column is None else list(chain.from_iterable(map(repeat, column, counts)))
            )

        return Rows(
            list(chain.from_iterable(parts)),
            spread(self.keys),
            spread(self.times),
            spread(self.index),
            self.topic,
            spread(self.firsts),
        )


@functools.lru_cache(maxsize=1 << 16)
def text_partition(key: str, partitions: int) -> int:
    """The partition of a text key, as Kafka's default partitioner gives it (cached:
    keys recur)."""
    return partition_for(key.encode("utf-8"), partitions)


def text_key(key: Any) -> str:
    """A key a user function gave, as text (keys are text, written as UTF-8)."""
    if isinstance(key, str):
        return key
    if isinstance(key, bytes):
        return key.decode("utf-8")
    raise TypeError(f"a key must be text, not {type(key).__name__} ({key!r:.80})")


def key_bytes(key: Any) -> bytes:
    if isinstance(key, bytes):
        return key
    if isinstance(key, str):
        return key.encode("utf-8")
    raise TypeError(f"a key must be text, not {type(key).__name__} ({key!r:.80})")


def to_bytes(value: Any, value_type: ValueType[Any] | None) -> bytes | None:
    """An output value as record bytes: bytes as they are, text as UTF-8, else with the
    stream's value type (JSON when it has none)."""
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    if value_type is not None:
        return value_type.encode(value)
    return orjson.dumps(value)


def encode_stored(raw: bytes) -> Any:
    """Record bytes as a JSON value: the text when it is UTF-8, else base64 in a list."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return ["b64", base64.b64encode(raw).decode()]


def decode_stored(stored: Any) -> bytes:
    if isinstance(stored, str):
        return stored.encode("utf-8")
    return base64.b64decode(stored[1])


#: How an aggregate is stored and how it is read back: (load, dump).
Forms = tuple[Callable[[Any], Any], Callable[[Any], Any]]


def stored_forms(value_type: ValueType[Any]) -> Forms | None:
    """How values of ``value_type`` are kept as a table's JSON (a reduce's aggregate is
    one): None when they are JSON already (text, JSON); a model's or a pydantic type's
    values as the JSON document they write; any other type's as its record bytes
    (:func:`encode_stored`)."""
    if isinstance(value_type, (TextType, JsonType)):
        return None
    encode, parse = value_type.encode, value_type.parse
    if isinstance(value_type, (Model, Typed)):
        from_json = value_type.from_json
        return (lambda doc: parse(from_json(doc), 1 << 62), lambda v: orjson.loads(encode(v)))
    return (lambda doc: parse(decode_stored(doc), 1 << 62), lambda v: encode_stored(encode(v)))


_UNSET: Any = object()


def fresh(value: Any) -> Any:
    """A copy of a stored value that a user function may change in place."""
    return orjson.loads(orjson.dumps(value))


def stream_time_key(topic: str, pipeline: str | None = None) -> bytes:
    """The state table's key of a pipeline's event time of a ``topic`` partition; without
    a pipeline, of the one a topology kept for all its pipelines before each kept its own."""
    if pipeline is None:
        return f"stream-time:{topic}".encode()
    return f"stream-time:{topic}:{pipeline}".encode()


class Runner:
    """The batch function of one compiled pipeline (see the module's docstring)."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.context = plan.context
        self.partitions = plan.context.partitions
        self.max_bytes = plan.context.max_event_bytes
        self._parsers: dict[str, Callable[[bytes | None, int], Any]] = {}
        self._stored_forms: dict[int, Forms | None] = {}
        for root in plan.roots:
            if root.kind == "source":
                value_type: Any = root.node.value_type
                tombstones = bool(root.node.params["tombstones"])
                try:
                    self._parsers[root.topic] = _parser(value_type, tombstones)
                except TypeError:  # a value type that cannot be hashed: a parser of its own
                    self._parsers[root.topic] = Parser(value_type, tombstones)

    def __repr__(self) -> str:
        return f"Runner({self.plan.name})"

    def __call__(self, batch: Batch) -> None:
        results: dict[int, Rows] = {}
        extra: dict[int, Any] = {}
        sources: dict[str, Rows] = {}
        for root in self.plan.roots:
            if root.kind == "source":
                rows = self._source(batch, root)
                sources[root.topic] = rows
                results[root.node.id] = rows
            else:
                self._receive(batch, root)
        for node in self.plan.steps:
            if node.op in ("to", "aggregate"):
                continue
            results[node.id] = self._step(batch, node, results, extra, sources)
        for sink in self.plan.sinks:
            found = results.get(sink.node.parents[0].id)
            if found is None:
                continue
            batch.counts[f"{self.plan.topology.name}.{sink.node.name}"] += len(found)
            self._sink(batch, sink, found, sources)
        for node in self.plan.steps:
            found = results.get(node.id)
            if found is not None:
                batch.counts[f"{self.plan.topology.name}.{node.name}"] += len(found)

    # -- sources ---------------------------------------------------------------------

    def _source(self, batch: Batch, root: Root) -> Rows:
        """A source topic's valid records as rows; the invalid ones dead-lettered when
        this pipeline is the one that reports them. What every pipeline reading the
        topic shares (the parsing, the key checks, the event times) is worked out once
        per cycle."""
        node, topic = root.node, root.topic
        params = node.params
        parse = self._parsers[topic]
        parsed = batch.parsed(topic, parse, self.max_bytes, InvalidEvent)
        need = self.plan.needs.get(node.id, frozenset())
        key_field: str | None = params["key"]
        if (
            key_field is None
            and not need
            and not any(map(isinstance, parsed, repeat(InvalidEvent)))
        ):
            return Rows(list(parsed), topic=topic)
        key = ("rows", topic, parse, key_field, params["timestamp"])
        found = batch.parses.get(key)
        if found is None or found[0] is not parsed:
            found = batch.parses[key] = (parsed, *_checked(batch, topic, parsed, params))
        _parsed, rows, refused = found
        if topic in self.plan.dead_letters:
            records = batch.of(topic)
            for i, reason in refused:
                batch.dead_letter(records[i], reason)
        return Rows(
            rows.values,
            rows.keys if "keys" in need else None,
            rows.times if need & {"times", "index"} else None,
            rows.index if need & {"index", "times"} else None,
            topic,
        )

    # -- steps ---------------------------------------------------------------------------

    def _step(
        self,
        batch: Batch,
        node: Node,
        results: dict[int, Rows],
        extra: dict[int, Any],
        sources: dict[str, Rows],
    ) -> Rows:
        op = node.op
        params = node.params
        rows = results[node.parents[0].id]
        if op == "map":
            values = self._each(node, rows.values)
            return Rows(values, rows.keys, rows.times, rows.index, rows.topic)
        if op == "filter":
            if "branch" in params:
                choice: list[int] = extra[node.parents[0].id]
                index = params["branch"]
                return rows.select([c == index for c in choice])
            return rows.select(self._each(node, rows.values))
        if op == "flat_map":
            fn = params["fn"]
            if params.get("vectorized"):
                return Rows(list(fn(rows.values)), topic=rows.topic)
            if rows.keys is None and rows.times is None and rows.index is None:
                return Rows(list(chain.from_iterable(map(fn, rows.values))), topic=rows.topic)
            return rows.expand([list(fn(v)) for v in rows.values])
        if op == "key_by":
            keys: list[bytes | None] = [key_bytes(k) for k in map(params["fn"], rows.values)]
            return Rows(rows.values, keys, rows.times, rows.index, rows.topic)
        if op == "branch":
            predicates = params["predicates"]
            last = len(predicates)
            if last == 1:  # two ways, the common case: one call per value, no generator
                [first] = predicates
                extra[node.id] = [0 if first(v) else 1 for v in rows.values]
            else:
                extra[node.id] = [
                    next((n for n, p in enumerate(predicates) if p(v)), last) for v in rows.values
                ]
            return rows
        if op == "join_global":
            return self._join_global(node, rows)
        if op == "join_table":
            return self._join_table(batch, node, rows)
        if op == "join_stream":
            return self._join_stream(batch, node, results, sources)
        raise AssertionError(f"unknown step {op}")

    def _each(self, node: Node, values: list[Any]) -> list[Any]:
        """A step's function over every value: one call per value, or one call for the
        batch when the step is vectorized (it must give one result per value)."""
        fn = node.params["fn"]
        if not node.params.get("vectorized"):
            return list(map(fn, values))
        results = list(fn(values))
        if len(results) != len(values):
            raise ValueError(
                f"{node.name}: a vectorized step gave {len(results)} results for "
                f"{len(values)} values"
            )
        return results

    def _join_global(self, node: Node, rows: Rows) -> Rows:
        params = node.params
        table = self.context.global_tables[params["table"].name]
        assert rows.times is not None
        keys = list(map(params["key"], rows.values))
        found = list(map(table.get, keys, rows.times))
        joiner = params["joiner"]
        if params["how"] == "inner":
            mask = [f is not None for f in found]
            rows = rows.select(mask)
            found = list(compress(found, mask))
        return Rows(
            list(map(joiner, rows.values, found)), rows.keys, rows.times, rows.index, rows.topic
        )

    def _join_table(self, batch: Batch, node: Node, rows: Rows) -> Rows:
        params = node.params
        view = batch.table(params["table"])
        assert rows.keys is not None
        found = [None if k is None else view.get(k) for k in rows.keys]
        if params["how"] == "inner":
            mask = [f is not None for f in found]
            rows = rows.select(mask)
            found = list(compress(found, mask))
        values = list(map(params["joiner"], rows.values, found))
        return Rows(values, rows.keys, rows.times, rows.index, rows.topic)

    def _join_stream(
        self, batch: Batch, node: Node, results: dict[int, Rows], sources: dict[str, Rows]
    ) -> Rows:
        """Both sides through the partition's join, in offset order per side; every
        valid record of a side's topic moves that side's event time, whether or not a
        filter took it out."""
        params = node.params
        buffer_name, index_name = join_tables(node)
        join = PartitionJoin(params["window"], batch.table(buffer_name), batch.table(index_name))
        left_node, right_node = node.parents
        for side, side_node, key_fn in (
            (LEFT, left_node, params["key"]),
            (RIGHT, right_node, params["other_key"]),
        ):
            rows = results[side_node.id]
            assert rows.topic is not None
            assert rows.index is not None
            assert rows.times is not None
            source = sources[rows.topic]
            assert source.index is not None
            assert source.times is not None
            records = batch.of(rows.topic)
            encode = side_node.value_type.encode
            src_index, src_times = source.index, source.times
            at = 0  # rows.index is in order, a part of src_index
            for i, record_key, value in zip(
                rows.index, rows.keys or repeat(None), rows.values, strict=False
            ):
                if src_index[at] != i:  # records a filter took out: they move event time
                    start = at
                    while src_index[at] != i:
                        at += 1
                    join.advance(side, max(src_times[start:at]))
                ts = src_times[at]
                at += 1
                join_key = text_key(record_key) if key_fn is None else text_key(key_fn(value))
                stored = [
                    None if record_key is None else record_key.decode("utf-8", "replace"),
                    encode_stored(encode(value)),
                    ts,
                ]
                join.process(side, ts, records[i].offset, join_key, stored)
            if at < len(src_times):
                join.advance(side, max(src_times[at:]))
        outcome = join.finish()
        joiner = params["joiner"]
        values: list[Any] = []
        keys: list[bytes | None] = []
        times: list[int] = []
        left_type, right_type = left_node.value_type, right_node.value_type
        for left, right in outcome.pairs:
            values.append(joiner(self._decoded(left_type, left), self._decoded(right_type, right)))
            keys.append(None if left[0] is None else left[0].encode("utf-8"))
            times.append(max(int(left[2]), int(right[2])))
        if params["how"] == "left":
            for left in outcome.unmatched:
                values.append(joiner(self._decoded(left_type, left), None))
                keys.append(None if left[0] is None else left[0].encode("utf-8"))
                times.append(int(left[2]))
        return Rows(values, keys, times, None, None)

    def _decoded(self, value_type: ValueType[Any], stored: list[Any]) -> Any:
        return value_type.parse(decode_stored(stored[1]), 1 << 62)

    # -- sinks -----------------------------------------------------------------------------

    def _sink(self, batch: Batch, sink: Sink, rows: Rows, sources: dict[str, Rows]) -> None:
        node = sink.node
        if sink.kind == "to":
            self._to(batch, node, rows)
        elif sink.kind == "send":
            self._send(batch, node, rows, sources)
        else:
            self._apply(batch, node, rows, sources)

    def _to(self, batch: Batch, node: Node, rows: Rows) -> None:
        params = node.params
        topic = params["topic"]
        key_fn, value_fn = params["key"], params["value"]
        keys: Iterator[bytes | None]
        if key_fn is None:
            keys = iter(rows.keys or repeat(None))
        else:
            keys = (None if k is None else key_bytes(k) for k in map(key_fn, rows.values))
        value_type = node.value_type if value_fn is None else None
        values = rows.values if value_fn is None else list(map(value_fn, rows.values))
        # Timed by the engine, by each record's input (where its topic takes that time):
        # the source record it came from, or a join's later record.
        inputs: Iterable[int | None]
        if rows.index is not None and rows.topic is not None:
            records = batch.of(rows.topic)
            inputs = [records[i].timestamp for i in rows.index]
        else:
            inputs = rows.times or repeat(None)
        for key, value, input_ms in zip(keys, values, inputs, strict=False):
            batch.send(topic, key, to_bytes(value, value_type), input_ms=input_ms)

    # -- aggregations ------------------------------------------------------------------------

    def _in_grace(self, batch: Batch, node: Node, rows: Rows, sources: dict[str, Rows]) -> Rows:
        """The records their windows' grace still lets in, the others counted late (once
        per window they miss). Each window is judged alone: a window is closed to a
        record once it ended ``grace`` or more before the record's source partition's
        event time (the largest seen, itself included). A record keeps the hopping
        windows still open (:attr:`Rows.firsts`); a session record opens a session that
        stays open ``gap`` after it (the gap in which another record would extend it),
        so it is late once its time is more than ``gap + grace`` behind."""
        window = self.plan.window(node)
        grace = None if window is None else window.grace_ms
        if grace is None or window is None:
            return rows
        assert rows.topic is not None
        assert rows.index is not None
        assert rows.times is not None
        times = rows.times
        stream_times = self._stream_times(batch, rows.topic, sources)
        limits = [stream_times[i] - grace for i in rows.index]  # ends up to it are closed
        late = 0
        if isinstance(window, Hopping):
            size = window.size_ms
            firsts: list[int] = []
            keep: list[bool] = []
            for t, limit in zip(times, limits, strict=True):
                starts = window.starts(t)
                open_ = [start for start in starts if start + size > limit]
                late += len(starts) - len(open_)
                keep.append(bool(open_))
                firsts.append(open_[0] if open_ else 0)
            if late:
                rows = Rows(rows.values, rows.keys, rows.times, rows.index, rows.topic, firsts)
        else:
            reach = window.gap_ms if isinstance(window, Session) else 0
            keep = [
                window.end(window.starts(t)[0]) + reach > limit
                for t, limit in zip(times, limits, strict=True)
            ]
            late = keep.count(False)
        if not late:
            return rows
        batch.counts[f"{self.plan.topology.name}.{node.name}.late"] += late
        return rows.select(keep) if not all(keep) else rows

    def _stream_times(self, batch: Batch, topic: str, sources: dict[str, Rows]) -> dict[int, int]:
        """Each source record's partition event time (the largest seen up to it), kept
        across batches in the topology's state table. Each pipeline keeps its own: it
        sees the topic's records in offset order, whereas a time shared by the pipelines
        would reach one already moved on by the others' batches of the same cycle."""
        cache = batch.cache.setdefault(("stream-time", topic), {})
        if cache.get("batch") is batch:
            return cache["times"]  # type: ignore[no-any-return]
        table = batch.table(state_table(self.plan.topology))
        key = stream_time_key(topic, self.plan.name)
        current = table.get(key)
        if current is None:
            # A deployment that kept one time per topology keeps it across the upgrade. It
            # is never written now: it would hand a pipeline's first batch the time that
            # another pipeline's batch of the same cycle reached.
            current = table.get(stream_time_key(topic))
        source = sources[topic]
        assert source.index is not None
        assert source.times is not None
        times: dict[int, int] = {}
        for i, t in zip(source.index, source.times, strict=True):
            current = t if current is None or t > current else current
            times[i] = current
        if current is not None:
            table.put(key, current)
        cache["batch"], cache["times"] = batch, times
        return times

    def _forms(self, node: Node) -> Forms | None:
        """How an aggregation's aggregates are stored, when not as they are (a reduce's
        aggregate is a value of its stream's type)."""
        if not node.params["aggregation"].of_values:
            return None
        found = self._stored_forms.get(node.id, _UNSET)
        if found is _UNSET:
            found = self._stored_forms[node.id] = stored_forms(node.value_type)
        return found  # type: ignore[no-any-return]

    def _horizon(self, node: Node) -> int:
        """Windows that end at or before this time (ms) have expired."""
        return int(self.context.clock() * 1000) - self.plan.retention_ms(node)

    def _send(self, batch: Batch, node: Node, rows: Rows, sources: dict[str, Rows]) -> None:
        """The records grouped by their new key, sent to its repartition partition:
        per batch one aggregate per key (and window) when the aggregation can merge,
        else every value in order."""
        params = node.params
        aggregation: Aggregation = params["aggregation"]
        window = self.plan.window(node)
        rows = self._in_grace(batch, node, rows, sources)
        key_fn = params["key"]
        new_keys: list[Any]
        if params.get("by_key"):  # the keys key_by gave
            rows = self._keyed(batch, node, rows)
            assert rows.keys is not None
            new_keys = [k.decode("utf-8") for k in rows.keys]  # type: ignore[union-attr]
        elif key_fn is None:
            new_keys = rows.values
            if not isinstance(node.parents[0].value_type, TextType) and not (
                set(map(type, new_keys)) <= {str}
            ):
                bad = next(v for v in new_keys if not isinstance(v, str))
                raise TypeError(
                    f"group_by() without a key groups by the value, which must be text, "
                    f"not {type(bad).__name__}: give group_by a key function"
                )
        else:
            new_keys = list(map(key_fn, rows.values))
        items: list[list[Any]]
        if aggregation.merge is None:
            encode = node.parents[0].value_type.encode
            times = rows.times or repeat(0)
            items = [
                [text_key(k), t, encode_stored(encode(v))]
                for k, t, v in zip(new_keys, times, rows.values, strict=False)
            ]
            if rows.firsts is not None:  # the hopping windows the grace left open
                for item, first in zip(items, rows.firsts, strict=True):
                    item.append(first)
            self._send_items(batch, node, VALUES, items)
            return
        if window is None:
            items = [[k, a] for k, a in _combine(aggregation, new_keys, rows.values).items()]
        elif isinstance(window, Session):
            assert rows.times is not None
            items = _sessions(aggregation, window.gap_ms, new_keys, rows.times, rows.values)
        else:
            assert rows.times is not None
            windowed_keys: list[tuple[str, int]] = []
            windowed_values: list[Any] = []
            if isinstance(window, Tumbling):  # one window per record
                size = window.size_ms
                windowed_keys = [
                    (k, t - t % size) for k, t in zip(new_keys, rows.times, strict=True)
                ]
                windowed_values = rows.values
            else:
                firsts = rows.firsts or repeat(0)
                for k, t, v, first in zip(new_keys, rows.times, rows.values, firsts, strict=False):
                    for start in window.starts(t):
                        if start >= first:
                            windowed_keys.append((k, start))
                            windowed_values.append(v)
            combined = _combine(aggregation, windowed_keys, windowed_values)
            items = [[k, start, a] for (k, start), a in combined.items()]
        forms = self._forms(node)
        for item in items:
            item[0] = text_key(item[0])
            if forms is not None:
                item[-1] = forms[1](item[-1])
        self._send_items(batch, node, COMBINED, items)

    def _send_items(self, batch: Batch, node: Node, field: str, items: list[list[Any]]) -> None:
        topic = self.plan.repartition_topic(node)
        by_partition: dict[int, list[list[Any]]] = {}
        partitions = self.partitions
        for item in items:
            partition = text_partition(item[0], partitions)
            found = by_partition.get(partition)
            if found is None:
                by_partition[partition] = [item]
            else:
                found.append(item)
        for partition, part in sorted(by_partition.items()):
            for piece in _pieces(field, part):
                batch.send(topic, None, piece, partition=partition)

    def _receive(self, batch: Batch, root: Root) -> None:
        """An aggregation's repartition records folded into its table."""
        node = root.node
        combined: list[list[Any]] = []
        values: list[list[Any]] = []
        for record in batch.of(root.topic):
            document = orjson.loads(record.value or b"null")
            if not isinstance(document, dict):
                raise ValueError(f"a repartition record of {root.topic} is not an object")
            combined.extend(document.get(COMBINED, ()))
            values.extend(document.get(VALUES, ()))
        if combined:
            forms = self._forms(node)
            if forms is not None:
                for item in combined:
                    item[-1] = forms[0](item[-1])
            self._merge_into(batch, node, combined)
        if values:
            parse = node.parents[0].value_type.parse
            keys = [item[0].encode("utf-8") for item in values]
            times = [int(item[1]) for item in values]
            decoded = [parse(decode_stored(item[2]), 1 << 62) for item in values]
            # an item's fourth field: its first hopping window the grace left open
            firsts = [int(item[3]) if len(item) > 3 else 0 for item in values]
            found = Rows(decoded, keys, times, firsts=firsts if any(firsts) else None)
            self._fold(batch, node, found)

    def _apply(self, batch: Batch, node: Node, rows: Rows, sources: dict[str, Rows]) -> None:
        """Records aggregated where they are (grouped by their own key)."""
        rows = self._keyed(batch, node, self._in_grace(batch, node, rows, sources))
        window = self.plan.window(node)
        aggregation: Aggregation = node.params["aggregation"]
        if isinstance(window, Session):
            assert rows.keys is not None
            assert rows.times is not None
            keys = [k.decode("utf-8") for k in rows.keys]  # type: ignore[union-attr]
            items = _sessions(aggregation, window.gap_ms, keys, rows.times, rows.values)
            self._merge_into(batch, node, items)
            return
        self._fold(batch, node, rows)

    def _keyed(self, batch: Batch, node: Node, rows: Rows) -> Rows:
        """The records that have a key, for an aggregation that groups by it: the others
        go to their dead-letter topic."""
        if rows.keys is None or None not in rows.keys:
            return rows
        keyed = [k is not None for k in rows.keys]
        if rows.index is not None and rows.topic is not None:
            records = batch.of(rows.topic)
            for i, ok in zip(rows.index, keyed, strict=True):
                if not ok:
                    batch.dead_letter(
                        records[i],
                        f"key: missing; {node.params['table']} groups records by their key",
                    )
        return rows.select(keyed)

    def _fold(self, batch: Batch, node: Node, rows: Rows) -> None:
        """Each key's values (in order) folded into its stored aggregate, each key (and
        window) read once and written once."""
        table = batch.table(node.params["table"])
        aggregation: Aggregation = node.params["aggregation"]
        window = self.plan.window(node)
        assert rows.keys is not None
        if window is None:
            groups = _group(rows.keys, rows.values)
        else:
            assert rows.times is not None
            horizon, index = self._expiry(batch, node, table)
            groups = {}
            expired = 0
            firsts = rows.firsts or repeat(0)
            for k, t, v, first in zip(rows.keys, rows.times, rows.values, firsts, strict=False):
                text = k.decode("utf-8")  # type: ignore[union-attr]
                for start in window.starts(t):
                    if start < first:
                        continue  # closed to it by its grace (counted where it was read)
                    end = window.end(start)
                    if end <= horizon:
                        expired += 1
                        continue
                    table_k = table_key(window, text, start)
                    found = groups.get(table_k)
                    if found is None:
                        groups[table_k] = [v]
                        index.add(end, table_k)
                    else:
                        found.append(v)
            if expired:
                batch.counts[f"{self.plan.topology.name}.{node.name}.expired"] += expired
        if aggregation.kind == "count":
            for key, vs in groups.items():
                table.put(key, int(table.get(key) or 0) + len(vs))
        else:
            adder, init = aggregation.adder, aggregation.initializer
            forms = self._forms(node)
            for key, vs in groups.items():
                text = _group_key(key, window)
                if forms is None:
                    stored = table.get_fresh(key)
                    state = init() if stored is None else stored
                else:
                    stored = table.get(key)
                    state = init() if stored is None else forms[0](stored)
                for v in vs:
                    state = adder(text, v, state)
                table.put_checked(key, state if forms is None else forms[1](state))
        if window is not None:
            self._expire(batch, node, table)

    def _merge_into(self, batch: Batch, node: Node, items: list[list[Any]]) -> None:
        """Combined aggregates merged into the stored ones."""
        table = batch.table(node.params["table"])
        aggregation: Aggregation = node.params["aggregation"]
        merge = aggregation.merge
        assert merge is not None
        window = self.plan.window(node)
        if isinstance(window, Session):
            self._merge_sessions(batch, node, table, window, items)
            return
        if window is None and aggregation.kind in ("count", "sum"):
            sums: dict[str, Any] = {}
            for key, partial in items:
                sums[key] = sums.get(key, 0) + partial
            for key, partial in sums.items():
                raw = key.encode("utf-8")
                stored = table.get(raw)
                table.put(raw, partial if stored is None else stored + partial)
            return
        totals: dict[bytes, list[Any]] = {}
        if window is None:
            for key, partial in items:
                _merge_total(totals, key.encode("utf-8"), key, partial, merge)
        else:
            horizon, index = self._expiry(batch, node, table)
            expired = 0
            for key, start, partial in items:
                end = window.end(start)
                if end <= horizon:
                    expired += 1
                    continue
                table_k = table_key(window, key, start)
                if table_k not in totals:
                    index.add(end, table_k)
                _merge_total(totals, table_k, key, partial, merge)
            if expired:
                batch.counts[f"{self.plan.topology.name}.{node.name}.expired"] += expired
        if aggregation.kind in ("count", "sum"):
            for table_k, (_text, partial) in totals.items():
                stored = table.get(table_k)
                table.put(table_k, partial if stored is None else stored + partial)
        else:
            forms = self._forms(node)
            for table_k, (text, partial) in totals.items():
                if forms is None:
                    stored = table.get_fresh(table_k)
                    total = partial if stored is None else merge(text, stored, partial)
                else:
                    stored = table.get(table_k)
                    total = partial if stored is None else merge(text, forms[0](stored), partial)
                    total = forms[1](total)
                table.put_checked(table_k, total)
        if window is not None:
            self._expire(batch, node, table)

    def _merge_sessions(
        self,
        batch: Batch,
        node: Node,
        table: TableView,
        window: Session,
        items: list[list[Any]],
    ) -> None:
        """Each incoming session merged with the stored sessions of its key that lie
        within the gap of it: they become one session, under a new key."""
        merge = node.params["aggregation"].merge
        forms = self._forms(node)
        gap = window.gap_ms
        horizon, index = self._expiry(batch, node, table)
        expired = 0
        for key, start, end, partial in sorted(items, key=lambda item: (item[0], item[1])):
            if end + 1 <= horizon:
                expired += 1
                continue
            overlapping: list[tuple[int, int, bytes, Any]] = []
            for stored_key, value in table.scan(key_prefix(key)):
                found = parse_window_range(stored_key)
                if found is None or found[0] != key:
                    continue
                s_start, s_end = found[1], round(found[2] * 1000)
                if s_end + gap >= start and s_start - gap <= end:
                    if forms is not None:
                        value = forms[0](value)
                    overlapping.append((s_start, s_end, stored_key, value))
            total = partial
            new_start, new_end = start, end
            for s_start, s_end, stored_key, value in sorted(overlapping, key=lambda o: o[0]):
                total = merge(key, value, total) if s_start <= start else merge(key, total, value)
                new_start, new_end = min(new_start, s_start), max(new_end, s_end)
                table.delete(stored_key)
            new_key = session_key(key, new_start, new_end)
            table.put_checked(new_key, total if forms is None else forms[1](total))
            index.add(new_end + 1, new_key)
        if expired:
            batch.counts[f"{self.plan.topology.name}.{node.name}.expired"] += expired
        self._expire(batch, node, table)

    def _expiry(self, batch: Batch, node: Node, table: TableView) -> tuple[int, WindowIndex]:
        window = self.plan.window(node)
        assert window is not None
        index: WindowIndex = batch.cache.setdefault(
            ("windows", node.params["table"]), WindowIndex(window)
        )
        if not index.loaded:
            index.load(table)
        return self._horizon(node), index

    def _expire(self, batch: Batch, node: Node, table: TableView) -> None:
        horizon, index = self._expiry(batch, node, table)
        for key in index.expire(horizon):
            table.delete(key)


# -- helpers ------------------------------------------------------------------------------


def _getter(values: Sequence[Any], name: str) -> Callable[[Any], Any]:
    """Reads field ``name`` of values like the first: a key of a JSON object, else an
    attribute."""
    first = next((v for v in values if v is not None and not isinstance(v, InvalidEvent)), None)
    if isinstance(first, dict):
        return operator.itemgetter(name)
    return operator.attrgetter(name)


def _checked(
    batch: Batch, topic: str, parsed: Sequence[Any], params: dict[str, Any]
) -> tuple[Rows, list[tuple[int, str]]]:
    """A topic's valid records as rows with every column, and (index, reason) of each
    refused record: its value's type refused it, or its key is not the declared field."""
    record_keys, stamps = record_keys_and_times(batch.of(topic))
    key_field: str | None = params["key"]
    ts_field: str | None = params["timestamp"]
    key_of = None if key_field is None else _getter(parsed, key_field)
    time_of = None if ts_field is None else _getter(parsed, ts_field)
    quick = _all_valid(record_keys, stamps, parsed, key_of, time_of)
    if quick is not None:
        return Rows(list(parsed), list(record_keys), quick, list(range(len(parsed))), topic), []
    values: list[Any] = []
    keys: list[bytes | None] = []
    times: list[int] = []
    index: list[int] = []
    refused: list[tuple[int, str]] = []
    for i, (key, stamp, value) in enumerate(zip(record_keys, stamps, parsed, strict=True)):
        if isinstance(value, InvalidEvent):
            refused.append((i, value.reason))
            continue
        if value is None:  # a deletion
            values.append(None)
            keys.append(key)
            index.append(i)
            times.append(stamp)
            continue
        try:
            if key_field is not None:
                expected = str(required_field(value, key_field))
                if key is None or key != expected.encode("utf-8"):
                    check_key(key, expected, key_field)
            time = stamp if ts_field is None else event_time(value, ts_field)
        except InvalidEvent as error:
            refused.append((i, error.reason))
            continue
        values.append(value)
        keys.append(key)
        index.append(i)
        times.append(time)
    return Rows(values, keys, times, index, topic), refused


def _all_valid(
    record_keys: Sequence[bytes | None],
    stamps: Sequence[int],
    parsed: Sequence[Any],
    key_of: Callable[[Any], Any] | None,
    time_of: Callable[[Any], Any] | None,
) -> list[int] | None:
    """The times of a batch in which every value parsed and every key is its declared
    field (the common case, checked a column at a time); None when some record must be
    judged one at a time by :func:`_checked`."""
    # map over C functions only: no Python frame per record
    if any(map(operator.is_, parsed, repeat(None))) or any(
        map(isinstance, parsed, repeat(InvalidEvent))
    ):
        return None
    try:
        if key_of is not None:
            expected = list(map(str.encode, map(str, map(key_of, parsed))))
            if expected != list(record_keys):
                return None
        if time_of is None:
            return list(stamps)
        times = list(map(time_of, parsed))
    except Exception:  # a value without such a field: judged one by one
        return None
    # whole milliseconds in range (a float, a text or a bool is judged one by one)
    if set(map(type, times)) != {int} or min(times) < 0 or max(times) > MAX_EVENT_TIME_MS:
        return None
    return times


class Parser:
    """How a source's values are parsed: one record at a time, and (``many``) a whole
    batch at a time where the value type can (``parse_many``). One per value type, so
    that pipelines reading the same topic share its parsing in a cycle."""

    def __init__(self, value_type: ValueType[Any], tombstones: bool) -> None:
        self.value_type = value_type
        self.tombstones = tombstones
        parse_many = getattr(value_type, "parse_many", None)
        if parse_many is not None and not tombstones:
            self.many = parse_many

    def __call__(self, raw: bytes | None, max_bytes: int) -> Any:
        if raw is None and self.tombstones:
            return None
        return self.value_type.parse(raw, max_bytes)


@functools.lru_cache(maxsize=256)
def _parser(value_type: Any, tombstones: bool) -> Parser:
    return Parser(value_type, tombstones)


def _group(keys: Sequence[bytes | None], values: Sequence[Any]) -> dict[Any, list[Any]]:
    groups: dict[Any, list[Any]] = {}
    for k, v in zip(keys, values, strict=True):
        found = groups.get(k)
        if found is None:
            groups[k] = [v]
        else:
            found.append(v)
    return groups


def _group_key(key: bytes, window: AnyWindow | None) -> str:
    """The key a user's function sees: the table key, or a window key's own key."""
    if window is None:
        return key.decode("utf-8")
    found = parse_window_range(key)
    assert found is not None
    return found[0]


def _combine(
    aggregation: Aggregation, keys: Sequence[Any], values: Sequence[Any]
) -> dict[Any, Any]:
    """One aggregate per key of a batch's values (the aggregation can merge)."""
    if aggregation.kind == "count":
        return dict(Counter(keys))
    if aggregation.kind == "sum" and aggregation.number is None:
        sums: dict[Any, Any] = {}
        for k, v in zip(keys, values, strict=True):
            sums[k] = sums.get(k, 0) + v
        return sums
    adder, init = aggregation.adder, aggregation.initializer
    states: dict[Any, Any] = {}
    for k, v in zip(keys, values, strict=True):
        state = states.get(k)
        if state is None:
            state = init()
        states[k] = adder(k if isinstance(k, str) else k[0], v, state)
    return states


def _merge_total(
    totals: dict[bytes, list[Any]],
    table_k: bytes,
    key: str,
    partial: Any,
    merge: Callable[[str, Any, Any], Any],
) -> None:
    found = totals.get(table_k)
    if found is None:
        totals[table_k] = [key, partial]
    else:
        found[1] = merge(key, found[1], partial)


def _sessions(
    aggregation: Aggregation,
    gap: int,
    keys: Sequence[Any],
    times: Sequence[int],
    values: Sequence[Any],
) -> list[list[Any]]:
    """A batch's records as sessions per key: ``[key, start, end, aggregate]``, records
    at most ``gap`` apart in one session (in event-time order)."""
    by_key: dict[str, list[tuple[int, int, Any]]] = {}
    for n, (k, t, v) in enumerate(zip(keys, times, values, strict=True)):
        by_key.setdefault(text_key(k), []).append((t, n, v))
    adder, init, merge = aggregation.adder, aggregation.initializer, aggregation.merge
    assert merge is not None
    out: list[list[Any]] = []
    for key, entries in by_key.items():
        entries.sort(key=lambda e: (e[0], e[1]))
        current: list[Any] | None = None
        for t, _n, v in entries:
            if current is not None and t - current[2] <= gap:
                current[2] = t
                current[3] = adder(key, v, current[3])
                continue
            if current is not None:
                out.append(current)
            current = [key, t, t, adder(key, v, init())]
        if current is not None:
            out.append(current)
    return out


def _pieces(field: str, items: list[list[Any]], limit: int = RECORD_BYTES) -> Iterator[bytes]:
    """The repartition record values that carry ``items``, each near ``limit`` bytes or
    less (halved until it is; a single item may exceed it)."""
    value = orjson.dumps({field: items})
    if len(value) <= limit or len(items) == 1:
        yield value
        return
    half = len(items) // 2
    yield from _pieces(field, items[:half], limit)
    yield from _pieces(field, items[half:], limit)
