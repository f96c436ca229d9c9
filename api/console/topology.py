"""The topology of a worker's pipelines as a graph, with records/s on its edges.

Built from the pipelines' declarations alone, so it holds for any pipeline: a pipeline is
a *step* between the topics it reads, the tables it writes and the topics it sends to. A
topic that pipelines both read and send to is a *repartition* topic; ``<topic>-dlq`` is
a *dead-letter* topic; a topic read and sent by none is a *source*, one only sent to an
*output*. The engine can dead-letter a record of any topic a pipeline reads, so each read
topic's dead-letter topic is drawn too.

A pipeline may describe its steps more finely with an optional ``graph`` attribute
(:class:`StepGraph`): its own nodes, and edges between them and the shared topic and
table nodes (named ``topic:<name>`` and ``table:<name>``). It replaces the pipeline's
single step node; rates are known on the edges that enter from a topic (records read) and
leave to a topic or table (records sent, keys written), unknown (null) inside.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from core.topics import dlq_topic

NodeKind = Literal["source", "step", "repartition", "table", "output", "dead-letter"]
#: records/s per (pipeline, topic or table)
Rates = Mapping[tuple[str, str], float]

DLQ_SUFFIX = dlq_topic("")


class StepNode(Protocol):
    """A node of a pipeline's own graph."""

    @property
    def id(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def label(self) -> str: ...


class StepGraph(Protocol):
    """A pipeline's finer graph: its steps and the edges between them and the shared
    ``topic:<name>`` / ``table:<name>`` nodes."""

    @property
    def nodes(self) -> Sequence[StepNode]: ...
    @property
    def edges(self) -> Sequence[tuple[str, str]]: ...


def topic_id(name: str) -> str:
    return f"topic:{name}"


def table_id(name: str) -> str:
    return f"table:{name}"


def step_id(pipeline: str, step: str | None = None) -> str:
    return f"step:{pipeline}" if step is None else f"step:{pipeline}/{step}"


@dataclass(frozen=True)
class SourceLag:
    """How far the group is behind on one topic, over all its partitions."""

    records: int
    ms: int


@dataclass(frozen=True)
class Flow:
    """What the group did per second, over the sampling window: see :class:`Rates`."""

    read: Rates = field(default_factory=dict)
    written: Rates = field(default_factory=dict)
    sent: Rates = field(default_factory=dict)


@dataclass
class _Graph:
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    edges: list[dict[str, Any]] = field(default_factory=list)

    def node(self, ident: str, kind: str, label: str, **more: Any) -> None:
        if ident not in self.nodes:
            self.nodes[ident] = {"id": ident, "kind": kind, "label": label, **more}

    def edge(self, source: str, target: str, rate: float | None, pipeline: str) -> None:
        rounded = None if rate is None else round(rate, 1)
        self.edges.append(
            {"from": source, "to": target, "records_per_s": rounded, "pipeline": pipeline}
        )


def topic_kinds(pipelines: Iterable[Any]) -> dict[str, NodeKind]:
    """The kind of every topic the pipelines name (see the module's docstring)."""
    listed = list(pipelines)
    reads = {t for p in listed for t in p.reads}
    sends = {t for p in listed for t in p.produces}
    dead = {dlq_topic(t) for t in reads} | {t for t in sends if t.endswith(DLQ_SUFFIX)}
    kinds: dict[str, NodeKind] = {}
    for topic in sorted(reads | sends | dead):
        if topic in dead and topic not in reads:
            kinds[topic] = "dead-letter"
        elif topic in reads and topic in sends:
            kinds[topic] = "repartition"
        elif topic in reads:
            kinds[topic] = "source"
        else:
            kinds[topic] = "output"
    return kinds


def build(
    pipelines: Sequence[Any],
    table_kinds: Mapping[str, str],
    flow: Flow,
    lag: Mapping[str, SourceLag],
) -> dict[str, Any]:
    """The graph: ``nodes`` (id, kind, label, and per kind more) and ``edges`` (from, to,
    records_per_s, pipeline). ``table_kinds``: the queryable tables' kinds (table,
    windowed, global); other tables are a pipeline's internal state."""
    graph = _Graph()
    kinds = topic_kinds(pipelines)
    for topic, kind in kinds.items():
        more: dict[str, Any] = {}
        if kind in ("source", "repartition"):
            behind = lag.get(topic)
            more = {
                "lag_records": None if behind is None else behind.records,
                "lag_ms": None if behind is None else behind.ms,
            }
        graph.node(topic_id(topic), kind, topic, **more)
    for pipeline in pipelines:
        for spec in pipeline.writes:
            table_kind = table_kinds.get(spec.name)
            graph.node(
                table_id(spec.name),
                "table",
                spec.name,
                table_kind=table_kind or "internal",
                queryable=table_kind is not None,
            )
        steps = getattr(pipeline, "graph", None)
        if steps is None:
            _single_step(graph, pipeline, flow)
        else:
            _finer_steps(graph, pipeline, steps, flow, table_kinds)
    return {"nodes": list(graph.nodes.values()), "edges": graph.edges}


def _single_step(graph: _Graph, pipeline: Any, flow: Flow) -> None:
    name: str = pipeline.name
    step = step_id(name)
    graph.node(step, "step", name, pipeline=name)
    for topic in pipeline.reads:
        graph.edge(topic_id(topic), step, flow.read.get((name, topic), 0.0), name)
    for spec in pipeline.writes:
        graph.edge(step, table_id(spec.name), flow.written.get((name, spec.name), 0.0), name)
    targets = list(dict.fromkeys([*pipeline.produces, *(dlq_topic(t) for t in pipeline.reads)]))
    for topic in targets:
        graph.edge(step, topic_id(topic), flow.sent.get((name, topic), 0.0), name)


#: The kinds of a pipeline graph's shared nodes, as this graph names them.
SHARED_KINDS = {"dlq": "dead-letter", "global": "table"}


def _finer_steps(
    graph: _Graph,
    pipeline: Any,
    steps: StepGraph,
    flow: Flow,
    table_kinds: Mapping[str, str],
) -> None:
    name: str = pipeline.name
    globals_ = set()
    for node in steps.nodes:
        if node.kind == "global":  # a global table: the topic it is restored from feeds it
            globals_.add(node.id)
            queryable = node.label in table_kinds
            graph.node(node.id, "table", node.label, table_kind="global", queryable=queryable)
        elif node.id.startswith(("topic:", "table:")):  # shared: kept as first drawn
            graph.node(node.id, SHARED_KINDS.get(node.kind, node.kind), node.label)
        else:
            graph.node(_endpoint(name, node.id), "step", node.label, pipeline=name, step=node.kind)
    for source, target in steps.edges:
        rate: float | None = None
        if target in globals_:
            # Every worker restores its own copy from the topic: no pipeline's rate, and
            # the edge drawn once, whichever pipelines join the table.
            if not any(e["from"] == source and e["to"] == target for e in graph.edges):
                graph.edge(source, target, None, "global")
            continue
        if source.startswith("topic:"):
            rate = flow.read.get((name, source.removeprefix("topic:")), 0.0)
        elif target.startswith("topic:"):
            rate = flow.sent.get((name, target.removeprefix("topic:")), 0.0)
        elif target.startswith("table:"):
            rate = flow.written.get((name, target.removeprefix("table:")), 0.0)
        graph.edge(_endpoint(name, source), _endpoint(name, target), rate, name)


def _endpoint(pipeline: str, ref: str) -> str:
    if ref.startswith(("topic:", "table:")):
        return ref
    return step_id(pipeline, ref.removeprefix("step:"))


#: The rates' lists in a report, and what their entries name besides the pipeline.
FIELDS = (("read", "topic"), ("written", "table"), ("sent", "topic"))


def group_flow(reports: Iterable[Mapping[str, Any]]) -> Flow:
    """The rates of every member's report, added up."""
    read: dict[tuple[str, str], float] = {}
    written: dict[tuple[str, str], float] = {}
    sent: dict[tuple[str, str], float] = {}
    for report in reports:
        rates = report.get("rates") or {}
        for name, second in FIELDS:
            into = {"read": read, "written": written, "sent": sent}[name]
            for entry in rates.get(name, ()):
                key = (entry["pipeline"], entry[second])
                into[key] = into.get(key, 0.0) + float(entry["per_s"])
    return Flow(read, written, sent)


def group_lag(reports: Iterable[Mapping[str, Any]]) -> dict[str, SourceLag]:
    """Per topic the members' tasks read: records behind (summed over partitions) and
    the age of the oldest record not applied (the largest over partitions)."""
    records: dict[str, int] = {}
    ages: dict[str, int] = {}
    for report in reports:
        for source in report.get("sources", ()):
            topic = source["topic"]
            records[topic] = records.get(topic, 0) + (source["lag_records"] or 0)
            ages[topic] = max(ages.get(topic, 0), source["lag_ms"] or 0)
    return {topic: SourceLag(records[topic], ages[topic]) for topic in records}
