"""A topology compiled into the engine's pipelines.

The graph is cut where records cross a repartition topic: the steps before a re-keying
aggregation end in a *send* to ``<app_id>-<table>-repartition``, and the aggregation
itself reads that topic. Each table, output and repartition send becomes one pipeline
(``tables.pipeline.Pipeline``) with the steps upstream of it, except that everything
downstream of one stream join shares a pipeline, since they share its state. Pipelines
that read the same topic share its parsing in each cycle.

Each pipeline's batch function is a :class:`streams.runtime.Runner` over its
:class:`Plan`, the same plan the nightly job recomputes from.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from core.topics import dlq_topic
from streams.topology import GlobalTable, Node, Topology, TopologyError
from tables.pipeline import Context, Graph, GraphNode, Pipeline, SourceSpec, TableSpec
from tables.windows import AnyWindow

Column = Literal["keys", "times", "index"]
ALL: frozenset[Column] = frozenset(("keys", "times", "index"))
NONE: frozenset[Column] = frozenset()

#: Join state: records of both sides by join key, and their index by event time.
JOIN_TABLES = ("join-buffer", "join-index")


def slug(name: str) -> str:
    """A step's name as it may appear in a topic or table name."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-") or "step"


def repartition_topic(app_id: str, table: str) -> str:
    return f"{app_id}-{table}-repartition"


def join_tables(node: Node) -> tuple[str, str]:
    """The names of a stream join's buffer and index tables."""
    base = f"{node.topology.name}-{slug(node.name)}"
    return f"{base}-{JOIN_TABLES[0]}", f"{base}-{JOIN_TABLES[1]}"


def state_table(topology: Topology) -> str:
    """The table of a topology's own bookkeeping (each pipeline's source event time, for
    graces)."""
    return f"{topology.name}-state"


@dataclass(frozen=True)
class Root:
    """Where a pipeline's records come from: a source topic, or the repartition topic
    of an aggregation (``node``)."""

    kind: Literal["source", "repartition"]
    node: Node
    topic: str


@dataclass(frozen=True)
class Sink:
    """Where a pipeline's records go: an output topic (``to``), an aggregation applied
    here (``apply``), or the send to an aggregation's repartition topic (``send``)."""

    kind: Literal["to", "apply", "send"]
    node: Node


@dataclass
class Plan:
    """One pipeline of a topology: its roots, its steps in order, its sinks, and the
    columns each step must carry (``needs``, by node id)."""

    name: str
    topology: Topology
    roots: list[Root]
    steps: list[Node]
    sinks: list[Sink]
    needs: dict[int, frozenset[Column]]
    context: Context
    reads: tuple[str, ...] = ()
    writes: tuple[TableSpec, ...] = ()
    produces: tuple[str, ...] = ()
    sources: tuple[SourceSpec, ...] = ()
    lookups: tuple[str, ...] = ()
    #: the source topics whose invalid records this pipeline dead-letters (see compile)
    dead_letters: set[str] = field(default_factory=set)

    def repartition_topic(self, node: Node) -> str:
        return repartition_topic(self.context.app_id, node.params["table"])

    def window(self, node: Node) -> AnyWindow | None:
        window: AnyWindow | None = node.params.get("window")
        return window

    def retention_ms(self, node: Node) -> int:
        window = self.window(node)
        found = None if window is None else window.retention_ms
        return self.context.window_retention_ms if found is None else found


@dataclass
class Compiled:
    """What a topology compiles to."""

    topology: Topology
    plans: list[Plan]
    pipelines: list[Pipeline]
    globals: list[GlobalTable]


# -- the graph --------------------------------------------------------------------------


def _sinks(topology: Topology) -> list[Sink]:
    sinks: list[Sink] = []
    for node in topology.nodes:
        if node.op == "to":
            sinks.append(Sink("to", node))
        elif node.op == "aggregate":
            sinks.append(Sink("send" if node.params["repartition"] else "apply", node))
    return sinks


def _cone(node: Node) -> set[int]:
    """The ids of a sink and every step upstream of it, up to the sources."""
    seen: set[int] = set()
    stack = [node]
    while stack:
        current = stack.pop()
        if current.id in seen:
            continue
        seen.add(current.id)
        stack.extend(current.parents)
    return seen


def _groups(topology: Topology, sinks: list[Sink]) -> list[list[Sink]]:
    """Sinks that share a stream join go together (they share its state); every other
    sink is a pipeline of its own."""
    by_id = {node.id: node for node in topology.nodes}
    joins_of = [{i for i in _cone(sink.node) if by_id[i].op == "join_stream"} for sink in sinks]
    groups: list[tuple[set[int], list[Sink]]] = []
    for sink, joins in zip(sinks, joins_of, strict=True):
        merged = [g for g in groups if g[0] & joins]
        rest = [g for g in groups if not g[0] & joins]
        joined_ids = set(joins).union(*(g[0] for g in merged))
        members = [s for g in merged for s in g[1]] + [sink]
        groups = [*rest, (joined_ids, members)]
    order = {id(sink): n for n, sink in enumerate(sinks)}
    return sorted((g[1] for g in groups), key=lambda members: order[id(members[0])])


def _requires(
    node: Node, sink_kind: str | None, needs: Mapping[int, frozenset[Column]]
) -> frozenset[Column]:
    """What a step needs of its input, given what its own output must carry."""
    out = needs.get(node.id, NONE)
    op = node.op
    if op == "to":
        return frozenset(("index", "keys") if node.params["key"] is None else ("index",))
    if op == "aggregate":
        windowed = node.params["window"] is not None
        if sink_kind == "apply":
            return frozenset(("keys", "index", "times") if windowed else ("keys", "index"))
        combined = node.params["aggregation"].merge is not None
        found: set[Column] = set()
        if node.params.get("by_key"):  # re-keyed by key_by: the new keys cross
            found.update(("keys", "index"))
        if windowed or not combined:
            found.add("times")
        if _grace(node) is not None:
            found.add("index")
        return frozenset(found)
    if op == "key_by":
        return out - {"keys"}
    if op == "join_global":
        return out | {"times"}
    if op == "join_table":
        return out | {"keys"}
    if op == "join_stream":
        return ALL
    return out


def _needs(steps: list[Node], sinks: list[Sink], members: set[int]) -> dict[int, frozenset[Column]]:
    """For each step, the columns its output must carry (besides the values)."""
    kind = {sink.node.id: sink.kind for sink in sinks}
    needs: dict[int, frozenset[Column]] = {}
    for node in reversed(steps):  # children before parents
        required = _requires(node, kind.get(node.id), needs)
        for parent in node.parents:
            if parent.id in members:
                needs[parent.id] = needs.get(parent.id, NONE) | required
    return needs


def _check(plan: Plan) -> None:
    """What a plan cannot run, named by step."""
    for node in plan.steps:
        if node.op == "join_stream":
            for side in node.parents:
                for upstream in _upstream(side):
                    if upstream.op not in ("map", "filter", "branch"):
                        raise node.fail(
                            "a stream join's inputs must come straight from their source "
                            f"topics (map and filter only), not through {upstream.name!r}"
                        )
        vectorized = node.op == "flat_map" and node.params.get("vectorized")
        if vectorized and (needs := plan.needs.get(node.id)):
            kept = {"keys": "keys", "times": "event times", "index": "source records"}
            lost = " or ".join(kept.get(n, n) for n in sorted(needs))
            raise node.fail(
                f"a vectorized flat_map does not know which record each result came from, "
                f"and a later step needs their {lost} (an output is timed by its source "
                "record, and keyed by it unless to() has key=): use flat_map without "
                "vectorized=, or count or aggregate its results with group_by()"
            )
        window = node.params.get("window") if node.op == "aggregate" else None
        if window is not None and window.grace_ms is not None and _upstream_op(node, "join_stream"):
            raise node.fail("a window with a grace must not follow a stream join")
        if node.op == "join_table":
            table = node.params["table"]
            if table not in node.topology.tables:
                raise node.fail(f"joins table {table!r}, which this topology does not write")
            if node.topology.tables[table].params["window"] is not None:
                raise node.fail(f"joins windowed table {table!r}: join a plain table")
            if _upstream_op(node, "key_by"):
                raise node.fail(
                    "joins a table with a re-keyed stream: its keys are in other partitions "
                    "than the table's"
                )


def _upstream(node: Node) -> Iterator[Node]:
    """A step and the steps before it on its first input, up to (not with) its source."""
    current = node
    while current.op != "source":
        yield current
        current = current.parents[0]


def _upstream_op(node: Node, op: str) -> bool:
    """Whether a step of kind ``op`` lies upstream of ``node`` on its first input (a
    stream join ends the search: its output is keyed anew)."""
    for upstream in _upstream(node.parents[0]):
        if upstream.op == op:
            return True
        if upstream.op == "join_stream":
            return False
    return False


# -- compiling ----------------------------------------------------------------------------


def _table_spec(plan: Plan, node: Node) -> TableSpec:
    window = node.params["window"]
    return TableSpec(
        node.params["table"],
        ordered=window is not None,
        queryable=bool(node.params["queryable"]),
        changelog_config=_window_changelog(plan, node),
        window=window,
        value_type=node.params["value_type"],
    )


def _window_changelog(plan: Plan, node: Node) -> tuple[tuple[str, str], ...]:
    """A windowed table's changelog deletes what is older than the windows' retention."""
    if node.params["window"] is None:
        return ()
    return (("cleanup.policy", "compact,delete"), ("retention.ms", str(plan.retention_ms(node))))


#: Expired join records leave tombstones; segments rolled every 10 minutes let the broker
#: compact them away.
JOIN_CHANGELOG = (("segment.ms", str(10 * 60 * 1000)),)


def _grace(node: Node) -> int | None:
    window = node.params.get("window")
    return None if window is None else window.grace_ms


def _source_spec(node: Node) -> SourceSpec:
    params = node.params
    return SourceSpec(
        params["topic"], node.value_type, params["key"], params["timestamp"], params["tombstones"]
    )


def _plan(topology: Topology, name: str, sinks: list[Sink], context: Context) -> Plan:
    members: set[int] = set()
    for sink in sinks:
        if sink.kind == "send":
            members |= _cone(sink.node)
        else:
            members |= _cone(sink.node)
    roots = [
        Root("source", n, n.params["topic"])
        for n in topology.nodes
        if n.id in members and n.op == "source"
    ]
    steps = [n for n in topology.nodes if n.id in members and n.op != "source"]
    needs = _needs([n for n in topology.nodes if n.id in members], sinks, members)
    plan = Plan(name, topology, roots, steps, sinks, needs, context)
    _check(plan)
    return plan


def _receive_plan(topology: Topology, node: Node, context: Context) -> Plan:
    topic = repartition_topic(context.app_id, node.params["table"])
    plan = Plan(
        f"{topology.name}.{node.params['table']}",
        topology,
        [Root("repartition", node, topic)],
        [],
        [Sink("apply", node)],
        {},
        context,
    )
    return plan


def _declare(plan: Plan) -> None:
    """Fill in what the plan reads, writes and produces."""
    reads: list[str] = [root.topic for root in plan.roots]
    writes: list[TableSpec] = []
    produces: list[str] = []
    lookups: list[str] = []
    for node in plan.steps:
        if node.op == "join_stream":
            buffer, index = join_tables(node)
            writes += [
                TableSpec(buffer, changelog_config=JOIN_CHANGELOG),
                TableSpec(index, ordered=True, changelog_config=JOIN_CHANGELOG),
            ]
        elif node.op == "join_table":
            lookups.append(node.params["table"])
        elif node.op == "aggregate" and _grace(node) is not None:
            writes.append(TableSpec(state_table(plan.topology)))
    for sink in plan.sinks:
        node = sink.node
        if sink.kind == "to":
            produces.append(node.params["topic"])
        elif sink.kind == "send":
            produces.append(plan.repartition_topic(node))
        else:
            writes.append(_table_spec(plan, node))
    for root in plan.roots:
        if root.kind == "source":
            produces.append(dlq_topic(root.topic))
    unique_writes = list({spec.name: spec for spec in writes}.values())
    plan.reads = tuple(dict.fromkeys(reads))
    plan.writes = tuple(unique_writes)
    plan.produces = tuple(dict.fromkeys(produces))
    plan.sources = tuple(_source_spec(r.node) for r in plan.roots if r.kind == "source")
    plan.lookups = tuple(
        dict.fromkeys(t for t in lookups if t not in {w.name for w in unique_writes})
    )


def _graph(plan: Plan) -> Graph:
    """The plan's steps as nodes and edges, topics and tables included."""
    nodes: dict[str, GraphNode] = {}
    edges: list[tuple[str, str]] = []

    def add(node_id: str, kind: Any, label: str) -> str:
        nodes.setdefault(node_id, GraphNode(node_id, kind, label))
        return node_id

    def step_id(node: Node) -> str:
        return f"step:{plan.topology.name}.{node.name}"

    for root in plan.roots:
        if root.kind == "source":
            add(f"topic:{root.topic}", "source", root.topic)
            add(f"topic:{dlq_topic(root.topic)}", "dlq", dlq_topic(root.topic))
            edges.append((f"topic:{root.topic}", f"topic:{dlq_topic(root.topic)}"))
        else:
            add(f"topic:{root.topic}", "repartition", root.topic)
    for node in plan.steps:
        add(step_id(node), "step", node.name)
        for parent in node.parents:
            origin = f"topic:{parent.params['topic']}" if parent.op == "source" else step_id(parent)
            edges.append((origin, step_id(node)))
        if node.op == "join_global":
            table = node.params["table"]
            add(f"topic:{table.topic}", "source", table.topic)
            add(f"table:{table.name}", "global", table.name)
            if (f"topic:{table.topic}", f"table:{table.name}") not in edges:
                edges.append((f"topic:{table.topic}", f"table:{table.name}"))
            edges.append((f"table:{table.name}", step_id(node)))
        if node.op == "join_table":
            add(f"table:{node.params['table']}", "table", node.params["table"])
            edges.append((f"table:{node.params['table']}", step_id(node)))
    for sink in plan.sinks:
        node = sink.node
        if sink.kind == "to":
            target = add(f"topic:{node.params['topic']}", "output", node.params["topic"])
            edges.append((step_id(node), target))
        elif sink.kind == "send":
            target = add(
                f"topic:{plan.repartition_topic(node)}", "repartition", plan.repartition_topic(node)
            )
            edges.append((step_id(node), target))
        else:
            table = add(f"table:{node.params['table']}", "table", node.params["table"])
            if plan.roots and plan.roots[0].kind == "repartition":
                add(step_id(node), "step", node.name)
                edges.append((f"topic:{plan.roots[0].topic}", step_id(node)))
            edges.append((step_id(node), table))
    return Graph(tuple(nodes.values()), tuple(dict.fromkeys(edges)))


def compile_topology(topology: Topology, context: Context) -> Compiled:
    """The pipelines of a topology (see the module's docstring)."""
    from streams.runtime import Runner  # the runtime imports this module's types

    sinks = _sinks(topology)
    plans: list[Plan] = []
    for group in _groups(topology, sinks):
        first = group[0]
        label = first.node.params.get("table") or first.node.params.get("topic") or first.node.name
        if first.kind == "send":
            label = f"{label}-repartition"
        plans.append(_plan(topology, f"{topology.name}.{label}", group, context))
    for sink in sinks:
        if sink.kind == "send":
            plans.append(_receive_plan(topology, sink.node, context))
    covered = {root.topic for plan in plans for root in plan.roots}
    for topic, node in topology.sources.items():
        if topic not in covered:  # read by no step: its records are still validated
            plans.append(
                Plan(
                    f"{topology.name}.{slug(topic)}",
                    topology,
                    [Root("source", node, topic)],
                    [],
                    [],
                    {},
                    context,
                )
            )
    for table in topology.globals.values():
        if table.topic not in covered and table.topic not in topology.sources:
            plans.append(_global_validation(topology, table, context))
    names = [plan.name for plan in plans]
    if len(set(names)) != len(names):
        raise TopologyError(f"topology {topology.name!r}: two pipelines named alike: {names}")
    pipelines = []
    for plan in plans:
        _declare(plan)
        pipelines.append(
            Pipeline(
                name=plan.name,
                reads=plan.reads,
                process=Runner(plan),
                writes=plan.writes,
                produces=plan.produces,
                cache=dict,
                sources=plan.sources,
                lookups=plan.lookups,
                graph=_graph(plan),
                recompute=plan,
            )
        )
    if not pipelines:
        raise TopologyError(f"topology {topology.name!r} declares nothing to run")
    return Compiled(topology, plans, pipelines, list(topology.globals.values()))


def _global_validation(topology: Topology, table: GlobalTable, context: Context) -> Plan:
    """The pipeline that dead-letters a global table's invalid records, once across the
    group (every worker keeps the table itself, from all partitions)."""
    node = Node(
        topology,
        -1 - len(topology.nodes),
        "source",
        f"source({table.topic})",
        (),
        table.value_type,
        {"topic": table.topic, "key": table.key, "timestamp": None, "tombstones": True},
    )
    return Plan(
        f"{topology.name}.{slug(table.topic)}",
        topology,
        [Root("source", node, table.topic)],
        [],
        [],
        {},
        context,
    )


def compile_all(items: Iterable[Any], context: Context) -> tuple[list[Pipeline], list[GlobalTable]]:
    """The pipelines of what pipeline modules returned: topologies are compiled,
    pipelines taken as they are. Each source topic's invalid records are dead-lettered
    by one pipeline only: the first that reads it."""
    pipelines: list[Pipeline] = []
    globals_: list[GlobalTable] = []
    writers: dict[str, str] = {}  # table -> the topology that writes it
    names: set[str] = set()
    for item in items:
        if isinstance(item, Topology):
            if item.name in names:  # their internal tables and topics would be shared
                raise TopologyError(f"two topologies are named {item.name!r}")
            names.add(item.name)
            compiled = compile_topology(item, context)
            for table in {spec.name for p in compiled.pipelines for spec in p.writes}:
                other = writers.setdefault(table, item.name)
                if other != item.name:
                    raise TopologyError(
                        f"table {table!r} is written by topologies {other!r} and {item.name!r}"
                    )
            pipelines += compiled.pipelines
            globals_ += compiled.globals
        elif isinstance(item, Pipeline):
            pipelines.append(item)
        else:
            raise TopologyError(f"a pipeline module returned {item!r}: a Topology or a Pipeline")
    owners: dict[str, str] = {}
    declared: dict[str, SourceSpec] = {}
    for pipeline in pipelines:
        for spec in pipeline.sources:
            known = declared.setdefault(spec.topic, spec)
            if known != spec:
                raise TopologyError(
                    f"topic {spec.topic!r} is declared with two types: {known} and {spec}"
                )
        plan = pipeline.recompute
        if isinstance(plan, Plan):
            for root in plan.roots:
                if root.kind == "source" and owners.setdefault(root.topic, plan.name) == plan.name:
                    plan.dead_letters.add(root.topic)
    return pipelines, globals_
