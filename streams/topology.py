"""Declaring a pipeline: sources, steps, re-keying, windows, aggregations, joins, outputs.

A :class:`Topology` is built once, at worker start, from calls such as::

    topology = Topology("words")
    lines = topology.source("lines", Text)
    lines.flat_map(str.split).group_by().count("counts")

Nothing runs here: each call adds a node to the topology's graph and returns a handle
to build on. :func:`streams.compile.compile_topology` turns the graph into the engine's
batch functions (``tables.pipeline.Pipeline``); a mistake in a declaration raises
:class:`TopologyError` naming the topology and the step.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import Field, StrictInt

from core.values import Bytes, BytesType, Json, Model, TextType, Typed, ValueType
from tables.join import JoinWindow
from tables.windows import AnyWindow, Hopping, Session, Tumbling

Fn = Callable[..., Any]
Op = Literal[
    "source",
    "map",
    "filter",
    "flat_map",
    "key_by",
    "branch",
    "join_global",
    "join_table",
    "join_stream",
    "to",
    "aggregate",
]


#: The values of count and sum tables, as a correction must give them.
COUNT: Typed[int] = Typed(StrictInt, name="count")
NUMBER: Typed[Any] = Typed(StrictInt | Annotated[float, Field(allow_inf_nan=False)], name="number")


class TopologyError(ValueError):
    """A declaration that cannot run: names the topology and the step."""


@dataclass(eq=False)
class Node:
    """One step of a topology's graph."""

    topology: Topology
    id: int
    op: Op
    name: str
    parents: tuple[Node, ...]
    #: the type of the values this step emits (how they cross a repartition or a buffer)
    value_type: ValueType[Any]
    params: dict[str, Any] = field(default_factory=dict)
    children: list[Node] = field(default_factory=list)

    def __repr__(self) -> str:
        return f"<{self.topology.name}.{self.name}>"

    def fail(self, problem: str) -> TopologyError:
        return TopologyError(f"topology {self.topology.name!r}, step {self.name!r}: {problem}")


@dataclass(frozen=True)
class Aggregation:
    """How values fold into an aggregate: ``adder(key, value, aggregate)`` in order, from
    ``initializer()``; ``merge(key, a, b)`` combines two aggregates of the same key (when
    given, values are combined per batch before they cross a repartition topic, and
    session windows can merge). ``kind`` names a built-in one, which runs faster."""

    kind: Literal["count", "sum", "reduce", "aggregate"]
    initializer: Callable[[], Any]
    adder: Callable[[str, Any, Any], Any]
    merge: Callable[[str, Any, Any], Any] | None
    #: sum: the number a value adds
    number: Callable[[Any], Any] | None = None
    #: reduce: whether the aggregate is a value of the stream's value type, stored (and
    #: sent across a repartition topic) as that type writes it
    of_values: bool = False


def _count_add(key: str, value: Any, total: int) -> int:
    return total + 1


def _sum_merge(key: str, a: Any, b: Any) -> Any:
    return a + b


def _zero() -> int:
    return 0


class _Missing:
    """The aggregate of a reduce before its first value."""

    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()


#: Characters Kafka allows in a topic name (a table's name is part of its changelog's).
_TOPIC_CHARACTERS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
#: Longest name accepted: Kafka's 249 less what the app id and the suffixes add.
MAX_NAME = 180
#: Ends of the names of a topology's internal tables.
_INTERNAL_ENDS = ("-state", "-join-buffer", "-join-index")


def _check_name(topology: str, what: str, name: Any) -> None:
    """A topic or table name must be one Kafka takes as (part of) a topic name."""
    if not isinstance(name, str) or not name or not set(name) <= _TOPIC_CHARACTERS:
        raise TopologyError(
            f"topology {topology!r}: {what} {name!r}: letters, digits, '.', '_' and '-' only"
        )
    if len(name) > MAX_NAME or name in (".", ".."):
        raise TopologyError(f"topology {topology!r}: {what} {name!r} is not a usable name")


def _check_field(
    topology: str, where: str, value: ValueType[Any], what: str, field_name: str
) -> None:
    """A source's key or timestamp field must be one its values can have."""
    if isinstance(value, (TextType, BytesType)):
        raise TopologyError(
            f"topology {topology!r}, {where}: {what}={field_name!r} names a field, and "
            f"{value.name} values have none"
        )
    if isinstance(value, Model):
        fields = value.model.model_fields
        if field_name not in fields:
            raise TopologyError(
                f"topology {topology!r}, {where}: {what}={field_name!r} is not a field of "
                f"{value.name} (its fields: {', '.join(fields)})"
            )


def _callable(node_name: str, topology: Topology, what: str, fn: Any) -> None:
    if not callable(fn):
        raise TopologyError(
            f"topology {topology.name!r}, step {node_name!r}: {what} must be callable, "
            f"not {type(fn).__name__}"
        )


def _fn_name(fn: Any) -> str:
    name = getattr(fn, "__name__", None) or type(fn).__name__
    return "lambda" if name == "<lambda>" else name


class Topology:
    """A named set of pipelines declared together; returned by a pipeline module's
    ``pipelines(context)`` (alone or in a list)."""

    def __init__(self, name: str) -> None:
        if not name or not name.replace("_", "").replace("-", "").isalnum():
            raise TopologyError(f"topology name {name!r}: letters, digits, '-' and '_' only")
        self.name = name
        self.nodes: list[Node] = []
        self.sources: dict[str, Node] = {}
        self.globals: dict[str, GlobalTable] = {}
        self.tables: dict[str, Node] = {}
        self._ids = itertools.count()
        self._names: set[str] = set()

    def __repr__(self) -> str:
        return f"Topology({self.name!r}, {len(self.nodes)} steps)"

    # -- declaring ------------------------------------------------------------------

    def source(
        self,
        topic: str,
        value: ValueType[Any] = Bytes,
        *,
        key: str | None = None,
        timestamp: str | None = None,
        tombstones: bool = False,
    ) -> Stream:
        """The records of a topic, parsed with ``value`` (a record it refuses goes to
        ``<topic>-dlq`` with the reason).

        ``key``: the field of the value that the record key must equal (the topic is
        partitioned by it). ``timestamp``: the field holding the event time in ms (else
        the record's timestamp). ``tombstones``: null values pass as None.
        """
        _check_name(self.name, "source topic", topic)
        if not isinstance(value, ValueType):
            raise TopologyError(
                f"topology {self.name!r}, source {topic!r}: {value!r} is not a value type "
                "(Text, Json, Bytes, Model(...) or an object with parse/encode/from_json)"
            )
        for what, field_name in (("key", key), ("timestamp", timestamp)):
            if field_name is not None:
                _check_field(self.name, f"source {topic!r}", value, what, field_name)
        params = {"topic": topic, "key": key, "timestamp": timestamp, "tombstones": tombstones}
        found = self.sources.get(topic)
        if found is not None:
            if found.params != params or found.value_type is not value:
                raise found.fail(f"topic {topic!r} is declared twice, differently")
            return Stream(found)
        node = self._add("source", f"source({topic})", (), value, params)
        self.sources[topic] = node
        return Stream(node)

    def global_table(
        self,
        topic: str,
        value: ValueType[Any] = Json,
        *,
        key: str | None = None,
        name: str | None = None,
        versions: int = 32,
    ) -> GlobalTable:
        """A table every worker keeps whole, from every partition of ``topic`` (usually
        compacted): each key's recent values with their record timestamps, so that a
        join reads the value as of the event's time. Invalid records go to the topic's
        dead-letter topic, once; a null value deletes the key."""
        table_name = name or topic
        _check_name(self.name, "global table topic", topic)
        _check_name(self.name, "global table", table_name)
        if table_name in self.globals:
            raise TopologyError(f"topology {self.name!r}: global table {table_name!r} twice")
        if versions < 1:
            raise TopologyError(
                f"topology {self.name!r}: global table {table_name!r}: versions < 1"
            )
        if key is not None:
            _check_field(self.name, f"global table {table_name!r}", value, "key", key)
        table = GlobalTable(self, table_name, topic, value, key, versions)
        self.globals[table_name] = table
        return table

    # -- the graph ------------------------------------------------------------------------

    def _add(
        self,
        op: Op,
        name: str,
        parents: Sequence[Node],
        value_type: ValueType[Any],
        params: dict[str, Any],
    ) -> Node:
        unique = name
        for n in itertools.count(2):
            if unique not in self._names:
                break
            unique = f"{name}#{n}"
        self._names.add(unique)
        node = Node(self, next(self._ids), op, unique, tuple(parents), value_type, params)
        for parent in parents:
            if parent.topology is not self:
                raise node.fail(f"joins a stream of topology {parent.topology.name!r}")
            parent.children.append(node)
        self.nodes.append(node)
        return node


@dataclass(frozen=True)
class GlobalTable:
    """A global table declared by :meth:`Topology.global_table`."""

    topology: Topology
    name: str
    topic: str
    value_type: ValueType[Any]
    key: str | None
    versions: int


@dataclass(frozen=True)
class Table:
    """A table an aggregation writes, partitioned like the keys it was grouped by."""

    node: Node

    @property
    def name(self) -> str:
        return str(self.node.params["table"])


class Stream:
    """The records of a step: values with their record keys and event times."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.topology = node.topology

    def __repr__(self) -> str:
        return f"Stream({self.node!r})"

    def _then(
        self,
        op: Op,
        fn: Any,
        name: str | None,
        value_type: ValueType[Any] | None = None,
        **params: Any,
    ) -> Node:
        step = name or f"{op}({_fn_name(fn)})"
        _callable(step, self.topology, f"{op}'s function", fn)
        kept = self.node.value_type if value_type is None else value_type
        return self.topology._add(op, step, (self.node,), kept, {"fn": fn, **params})

    # -- stateless ----------------------------------------------------------------------

    def map(
        self,
        fn: Callable[[Any], Any],
        *,
        value_type: ValueType[Any] = Json,
        vectorized: bool = False,
        name: str | None = None,
    ) -> Stream:
        """Each value replaced by ``fn(value)``; the key stays. ``vectorized``: ``fn``
        takes a batch's values (a list) and returns their results, one each, in order."""
        return Stream(self._then("map", fn, name, value_type, vectorized=vectorized))

    def filter(
        self, fn: Callable[[Any], Any], *, vectorized: bool = False, name: str | None = None
    ) -> Stream:
        """The records whose value ``fn`` finds true. ``vectorized``: ``fn`` takes a
        batch's values (a list) and returns a truth value for each, in order."""
        return Stream(self._then("filter", fn, name, vectorized=vectorized))

    def flat_map(
        self,
        fn: Callable[[Any], Any],
        *,
        value_type: ValueType[Any] = Json,
        vectorized: bool = False,
        name: str | None = None,
    ) -> Stream:
        """Each value replaced by the values ``fn(value)`` yields (none or many); each
        keeps the record's key and event time. ``vectorized``: ``fn`` takes a batch's
        values (a list) and returns every result of all of them, in one iterable; no
        later step may then need the records' keys or times (a ``group_by`` that counts
        the results may)."""
        return Stream(self._then("flat_map", fn, name, value_type, vectorized=vectorized))

    def key_by(self, fn: Callable[[Any], str], *, name: str | None = None) -> Stream:
        """The records keyed by ``fn(value)`` (text): what ``to`` writes them with, and
        what ``group_by_key`` groups them by (through a repartition topic)."""
        return Stream(self._then("key_by", fn, name))

    def branch(self, *predicates: Callable[[Any], Any], name: str | None = None) -> list[Stream]:
        """One stream per predicate and one for the rest: each record goes to the first
        branch whose predicate finds its value true, else to the last stream."""
        if not predicates:
            raise self.node.fail("branch() needs at least one predicate")
        step = name or "branch"
        for predicate in predicates:
            _callable(step, self.topology, "a branch predicate", predicate)
        node = self.topology._add(
            "branch", step, (self.node,), self.node.value_type, {"predicates": predicates}
        )
        outs = []
        for index in range(len(predicates) + 1):
            out = self.topology._add(
                "filter",
                f"{node.name}[{index}]",
                (node,),
                node.value_type,
                {"branch": index},
            )
            outs.append(Stream(out))
        return outs

    # -- outputs --------------------------------------------------------------------------

    def to(
        self,
        topic: str,
        *,
        key: Callable[[Any], str | bytes | None] | None = None,
        value: Callable[[Any], Any] | None = None,
        name: str | None = None,
    ) -> None:
        """Write each record to ``topic``: keyed by ``key(value)`` (else the record's
        key), its value ``value(value)`` (else the value itself) written as bytes (as
        they are), text (UTF-8) or anything else with the stream's value type."""
        _check_name(self.topology.name, "output topic", topic)
        for what, fn in (("key", key), ("value", value)):
            if fn is not None:
                _callable(name or f"to({topic})", self.topology, f"to's {what}", fn)
        self.topology._add(
            "to",
            name or f"to({topic})",
            (self.node,),
            self.node.value_type,
            {"topic": topic, "key": key, "value": value},
        )

    # -- grouping -------------------------------------------------------------------------

    def group_by(
        self, key: Callable[[Any], str] | None = None, *, name: str | None = None
    ) -> GroupedStream:
        """Group the records by a new key, ``key(value)`` (text; None: the value itself,
        which must be text). They cross a repartition topic to the partition of their new
        key; the aggregation combines them per batch before they do, where it can."""
        if key is not None:
            _callable(name or "group_by", self.topology, "group_by's key", key)
        elif isinstance(self.node.value_type, (Model, BytesType)):
            raise self.node.fail(
                f"group_by() without a key groups by the value itself, which must be text, "
                f"and its values are {self.node.value_type.name}: give group_by a key function"
            )
        return GroupedStream(self, key, True, name)

    def group_by_key(self) -> GroupedStream:
        """Group the records by their key: no repartition unless ``key_by`` changed it."""
        return GroupedStream(self, None, self._rekeyed(), None, by_key=True)

    def _rekeyed(self) -> bool:
        node = self.node
        while node.op != "source":
            if node.op in ("key_by", "join_stream"):
                return node.op == "key_by"
            node = node.parents[0]
        return False

    # -- joins ------------------------------------------------------------------------------

    def join(
        self,
        other: GlobalTable | Table | Stream,
        joiner: Callable[[Any, Any], Any],
        *,
        how: Literal["inner", "left"] = "inner",
        key: Callable[[Any], str] | None = None,
        other_key: Callable[[Any], str] | None = None,
        window: JoinWindow | None = None,
        value_type: ValueType[Any] = Json,
        name: str | None = None,
    ) -> Stream:
        """Join each record with ``other``; ``joiner(value, other_value)`` is the new value.

        * a :class:`GlobalTable`: the value of ``key(value)`` as of the record's event
          time (``key`` required);
        * a :class:`Table` of this topology: its current value for the record's key (the
          stream must be keyed and partitioned as the table);
        * a :class:`Stream`: the other stream's records whose join key
          (``other_key(value)``, else the record key) equals this one's (``key(value)``,
          else the record key) and whose event time lies in ``window`` around this
          record's (``window`` required). Both streams are read from co-partitioned
          topics: records that may match must sit in partitions of the same number.
          The result's key is this stream's record key.

        ``how="left"``: a record that finds nothing is joined with None (for a stream,
        once event time on both sides has passed its window).
        """
        if how not in ("inner", "left"):
            raise self.node.fail(f"join how={how!r}: 'inner' or 'left'")
        step = name or f"join({getattr(other, 'name', None) or 'stream'})"
        _callable(step, self.topology, "the joiner", joiner)
        for what, fn in (("key", key), ("other_key", other_key)):
            if fn is not None:
                _callable(step, self.topology, f"the join's {what}", fn)
        params: dict[str, Any] = {"joiner": joiner, "how": how, "key": key}
        if isinstance(other, (GlobalTable, Table)):
            owner = other.topology if isinstance(other, GlobalTable) else other.node.topology
            if owner is not self.topology:
                raise self.node.fail(
                    f"{step}: {other.name!r} belongs to topology {owner.name!r}; declare "
                    "what a topology joins in that topology"
                )
        if isinstance(other, GlobalTable):
            if key is None:
                raise self.node.fail(f"{step}: a join with a global table needs key=")
            if window is not None or other_key is not None:
                raise self.node.fail(f"{step}: window= and other_key= are for stream joins")
            node = self.topology._add(
                "join_global", step, (self.node,), value_type, {**params, "table": other}
            )
        elif isinstance(other, Table):
            if window is not None or other_key is not None or key is not None:
                raise self.node.fail(f"{step}: a table join reads the table by the record key")
            node = self.topology._add(
                "join_table", step, (self.node,), value_type, {**params, "table": other.name}
            )
        elif isinstance(other, Stream):
            if window is None:
                raise self.node.fail(f"{step}: a stream join needs window=JoinWindow(...)")
            node = self.topology._add(
                "join_stream",
                step,
                (self.node, other.node),
                value_type,
                {**params, "other_key": other_key, "window": window},
            )
        else:
            raise self.node.fail(f"{step}: cannot join a {type(other).__name__}")
        return Stream(node)


class GroupedStream:
    """Records grouped by key, ready to aggregate (optionally in windows)."""

    def __init__(
        self,
        stream: Stream,
        key: Callable[[Any], str] | None,
        repartition: bool,
        name: str | None,
        window: AnyWindow | None = None,
        *,
        by_key: bool = False,
    ) -> None:
        self.stream = stream
        self.key = key
        self.repartition = repartition
        self.name = name
        self.window = window
        #: grouped by the record key (group_by_key), not by a function of the value
        self.by_key = by_key

    def window_by(self, window: AnyWindow) -> GroupedStream:
        """Aggregate in event-time windows (``Tumbling``, ``Hopping``, ``Session``)."""
        if self.window is not None:
            raise self.stream.node.fail("window_by() twice")
        if not isinstance(window, (Tumbling, Hopping, Session)):
            raise self.stream.node.fail(
                f"window_by({window!r:.60}): a window is Tumbling(size), "
                "Hopping(size, advance) or Session(gap)"
            )
        return GroupedStream(
            self.stream, self.key, self.repartition, self.name, window, by_key=self.by_key
        )

    def count(self, table: str, *, queryable: bool = True) -> Table:
        """How many records each key (and window) has had."""
        return self._aggregate(
            table, Aggregation("count", _zero, _count_add, _sum_merge), queryable, COUNT
        )

    def sum(
        self, table: str, number: Callable[[Any], Any] | None = None, *, queryable: bool = True
    ) -> Table:
        """The sum of ``number(value)`` (else the value) over each key's records."""
        if number is not None:
            _callable(table, self.stream.topology, "sum's number", number)

        def add(key: str, value: Any, total: Any) -> Any:
            return total + (value if number is None else number(value))

        return self._aggregate(
            table, Aggregation("sum", _zero, add, _sum_merge, number), queryable, NUMBER
        )

    def reduce(
        self, table: str, reducer: Callable[[Any, Any], Any], *, queryable: bool = True
    ) -> Table:
        """``reducer(aggregate, value)`` over each key's values, the first value as the
        start. The reducer must be associative: batches are reduced before they cross a
        repartition topic, and their results reduced again."""
        _callable(table, self.stream.topology, "the reducer", reducer)

        def add(key: str, value: Any, aggregate: Any) -> Any:
            return value if aggregate is MISSING else reducer(aggregate, value)

        def merge(key: str, a: Any, b: Any) -> Any:
            if a is MISSING:
                return b
            return a if b is MISSING else reducer(a, b)

        return self._aggregate(
            table,
            Aggregation("reduce", lambda: MISSING, add, merge, of_values=True),
            queryable,
            None,
        )

    def aggregate(
        self,
        table: str,
        initializer: Callable[[], Any],
        adder: Callable[[str, Any, Any], Any],
        *,
        merge: Callable[[str, Any, Any], Any] | None = None,
        value_type: ValueType[Any] | None = None,
        queryable: bool = True,
    ) -> Table:
        """``adder(key, value, aggregate)`` over each key's values in order, starting
        from ``initializer()``; the aggregate is stored as JSON. ``merge(key, a, b)``,
        when given, combines two aggregates: values are then combined per batch before
        they cross a repartition topic, and session windows can merge. ``value_type``
        checks values written into the table from outside (nightly corrections)."""
        for what, fn in (("initializer", initializer), ("adder", adder), ("merge", merge)):
            if fn is not None:
                _callable(table, self.stream.topology, f"aggregate's {what}", fn)
        return self._aggregate(
            table, Aggregation("aggregate", initializer, adder, merge), queryable, value_type
        )

    def _aggregate(
        self,
        table: str,
        aggregation: Aggregation,
        queryable: bool,
        value_type: ValueType[Any] | None,
    ) -> Table:
        topology = self.stream.topology
        _check_name(topology.name, "table", table)
        if table.endswith(_INTERNAL_ENDS):
            raise self.stream.node.fail(
                f"table {table!r}: names ending in {', '.join(_INTERNAL_ENDS)} are kept for "
                "the tables a topology keeps itself"
            )
        if table in topology.tables:
            raise topology.tables[table].fail(f"table {table!r} is written by two aggregations")
        if isinstance(self.window, Session) and aggregation.merge is None:
            raise self.stream.node.fail(
                f"{table}: session windows merge aggregates: give aggregate() a merge="
            )
        node = topology._add(
            "aggregate",
            self.name or table,
            (self.stream.node,),
            self.stream.node.value_type,
            {
                "table": table,
                "key": self.key,
                "by_key": self.by_key,
                "repartition": self.repartition,
                "window": self.window,
                "aggregation": aggregation,
                "queryable": queryable,
                "value_type": value_type,
            },
        )
        topology.tables[table] = node
        return Table(node)
