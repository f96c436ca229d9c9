"""What the nightly job recomputes, and how: derived from the loaded pipelines.

Every table an aggregation of the streams API writes is recomputed from its pipeline's
declaration (``Pipeline.recompute``, a :class:`streams.compile.Plan`): the same batch
functions run over the retained records. A pipeline written as a batch function is
recomputed when it declares ``recompute="replay"`` (its function is then run over its
topics in offset order, partition by partition, as the engine runs it); otherwise its
tables are listed as not recomputed, with the reason.

The pipelines run in **stages**: stage 0 reads the source topics; a pipeline that reads
topics other pipelines write (a repartition topic) runs in the stage after its writers,
on what they sent there. Within a stage, each kind of pipeline gets the parallelism its
semantics allow:

* **chunks**: a pipeline that only sends combined aggregates to a repartition topic
  after stateless steps folds each record independently, and its combiner is
  associative, so any run of records may be a task (a partition's records split);
* **partitions**: anything that keeps state in offset order (an aggregation applied
  where the records are, a stream join, a window grace, a batch function replayed) sees
  each partition's records in offset order, in one task per partition number.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from streams.compile import Plan
from streams.loading import Loaded
from streams.topology import Aggregation, Node
from tables.global_table import GlobalSpec
from tables.pipeline import Pipeline, TableSpec

#: The value of ``Pipeline.recompute`` by which a batch-function pipeline says that its
#: function may be replayed over its topics (per partition, in offset order, in batches
#: of any size) to recompute its tables.
REPLAY = "replay"

Mode = Literal["chunks", "partitions"]

#: Steps that keep no state between records.
STATELESS = frozenset(("map", "filter", "flat_map", "key_by", "branch", "join_global"))


@dataclass(frozen=True)
class Recomputed:
    """How one table is recomputed: by which pipelines, how, and why its result can
    differ from the stream's without either being wrong (None: it cannot)."""

    table: str
    pipelines: tuple[str, ...]
    how: str
    order_dependent: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "pipelines": list(self.pipelines),
            "how": self.how,
            "order_dependent": self.order_dependent,
        }


@dataclass(frozen=True)
class NotRecomputed:
    """A table the job cannot recompute, and why."""

    table: str
    pipeline: str
    reason: str

    def as_json(self) -> dict[str, str]:
        return {"table": self.table, "pipeline": self.pipeline, "reason": self.reason}


@dataclass(frozen=True)
class Stage:
    """Pipelines that run together, on the topics they read."""

    number: int
    pipelines: tuple[str, ...]
    reads: frozenset[str]


@dataclass
class JobPlan:
    """The recompute of a set of loaded pipelines."""

    pipelines: dict[str, Pipeline]
    stages: list[Stage]
    #: the tables compared with the live ones, by name
    tables: dict[str, Recomputed]
    specs: dict[str, TableSpec]
    not_recomputed: list[NotRecomputed]
    #: per pipeline that runs: chunks or partitions
    modes: dict[str, Mode]
    #: topics written in one stage and read in a later one
    internal: frozenset[str]
    globals: dict[str, GlobalSpec]
    #: pipelines that write nothing the job compares (listed in the report)
    unused: list[str] = field(default_factory=list)

    @property
    def sources(self) -> frozenset[str]:
        """The retained topics stage 0 reads."""
        return self.stages[0].reads if self.stages else frozenset()

    @property
    def split_topics(self) -> frozenset[str]:
        """Source topics read only by pipelines that may run on any chunk of records."""
        if not self.stages:
            return frozenset()
        ordered = {
            topic
            for name in self.stages[0].pipelines
            if self.modes[name] == "partitions"
            for topic in self.pipelines[name].reads
        }
        return self.sources - ordered

    def stage_of(self, pipeline: str) -> int:
        return next(s.number for s in self.stages if pipeline in s.pipelines)


def plan_of(pipeline: Pipeline) -> Plan | None:
    recompute = pipeline.recompute
    return recompute if isinstance(recompute, Plan) else None


def result_tables(pipeline: Pipeline) -> list[str]:
    """The tables of a pipeline that the job compares: an API pipeline's aggregation
    tables; a batch function's queryable tables."""
    plan = plan_of(pipeline)
    if plan is not None:
        return [sink.node.params["table"] for sink in plan.sinks if sink.kind == "apply"]
    return [spec.name for spec in pipeline.writes if spec.queryable]


def plan_job(loaded: Loaded) -> JobPlan:
    """Which pipelines run in which stage and mode, and what each table's recompute is."""
    pipelines = {p.name: p for p in loaded.pipelines}
    order = {name: n for n, name in enumerate(pipelines)}
    writers: dict[str, list[str]] = {}
    for pipeline in loaded.pipelines:
        for spec in pipeline.writes:
            writers.setdefault(spec.name, []).append(pipeline.name)
    producers: dict[str, list[str]] = {}
    for pipeline in loaded.pipelines:
        for topic in pipeline.produces:
            producers.setdefault(topic, []).append(pipeline.name)
    not_recomputed: list[NotRecomputed] = []
    refused: dict[str, str] = {}  # pipeline -> why it cannot run
    for pipeline in loaded.pipelines:
        if plan_of(pipeline) is None and pipeline.recompute != REPLAY:
            refused[pipeline.name] = (
                "a batch-function pipeline without a recompute: declare "
                f'recompute="{REPLAY}" if its function may be replayed over its topics in '
                "offset order"
            )
    stages = _stages(loaded.pipelines, producers, refused)
    _lookups(loaded.pipelines, writers, stages, refused)
    wanted = _wanted(loaded.pipelines, producers, writers, refused)
    for name in list(wanted):
        if name in refused:
            wanted.discard(name)
    tables: dict[str, Recomputed] = {}
    for pipeline in loaded.pipelines:
        if pipeline.name not in refused:
            for table in result_tables(pipeline):
                tables.setdefault(table, _recomputed(table, pipeline, pipelines, producers))
    for pipeline in loaded.pipelines:
        if pipeline.name in refused:
            for table in result_tables(pipeline):
                if table not in tables:  # else recomputed from the pipeline that declares it
                    reason = refused[pipeline.name]
                    not_recomputed.append(NotRecomputed(table, pipeline.name, reason))
    running = sorted(wanted, key=order.__getitem__)
    by_stage: dict[int, list[str]] = {}
    for name in running:
        by_stage.setdefault(stages[name], []).append(name)
    stage_list = [
        Stage(
            number,
            tuple(names),
            frozenset(t for name in names for t in pipelines[name].reads),
        )
        for number, names in sorted(by_stage.items())
    ]
    internal = frozenset(
        topic for stage in stage_list[1:] for topic in stage.reads if topic in producers
    )
    modes = {name: _mode(pipelines[name], internal) for name in running}
    unused = [
        name
        for name in pipelines
        if name not in wanted and name not in refused and not result_tables(pipelines[name])
    ]
    specs = {name: loaded.tables[name] for name in tables}
    return JobPlan(
        pipelines,
        stage_list,
        tables,
        specs,
        not_recomputed,
        modes,
        internal,
        dict(loaded.globals),
        unused,
    )


def _stages(
    pipelines: Iterable[Pipeline], producers: Mapping[str, list[str]], refused: dict[str, str]
) -> dict[str, int]:
    """Each pipeline's stage: 0 when it reads only source topics, else one after the
    pipelines that write what it reads. A pipeline that reads both, or a cycle, is
    refused."""
    found: dict[str, int] = {}
    pending = {p.name: p for p in pipelines}
    while pending:
        progressed = False
        for name, pipeline in list(pending.items()):
            written = [t for t in pipeline.reads if t in producers]
            if written and len(written) < len(pipeline.reads):
                refused[name] = (
                    f"reads source topics and topics other pipelines write ({', '.join(written)})"
                    " in one pipeline"
                )
            upstream = [p for t in written for p in producers[t]]
            if any(p in refused for p in upstream) and name not in refused:
                refused[name] = f"reads what {', '.join(sorted(set(upstream)))} writes, which "
                refused[name] += "is not recomputed"
            if name in refused:
                del pending[name]
                progressed = True
                continue
            if all(p in found for p in upstream):
                found[name] = 1 + max((found[p] for p in upstream), default=-1)
                del pending[name]
                progressed = True
        if not progressed:
            for name in pending:
                refused[name] = "reads topics written in a cycle of pipelines"
            break
    return found


def _lookups(
    pipelines: Iterable[Pipeline],
    writers: Mapping[str, list[str]],
    stages: Mapping[str, int],
    refused: dict[str, str],
) -> None:
    """A pipeline that reads another's table must run beside it (same partitions,
    same stage): it reads the table as the writer leaves it, cycle by cycle."""
    for pipeline in pipelines:
        if pipeline.name in refused:
            continue
        for table in pipeline.lookups:
            for writer in writers.get(table, []):
                if writer in refused or stages.get(writer) != stages.get(pipeline.name):
                    refused[pipeline.name] = (
                        f"reads table {table!r}, which {writer} writes behind a repartition "
                        "topic (or does not recompute): what it reads depends on timing"
                    )


def _wanted(
    pipelines: Iterable[Pipeline],
    producers: Mapping[str, list[str]],
    writers: Mapping[str, list[str]],
    refused: Mapping[str, str],
) -> set[str]:
    """The pipelines that write a compared table, and everything they need: the writers
    of the topics they read and of the tables they read."""
    by_name = {p.name: p for p in pipelines}
    wanted = {p.name for p in by_name.values() if result_tables(p) and p.name not in refused}
    stack = list(wanted)
    while stack:
        pipeline = by_name[stack.pop()]
        needed = [w for t in pipeline.reads for w in producers.get(t, [])]
        needed += [w for t in pipeline.lookups for w in writers.get(t, [])]
        for name in needed:
            if name not in wanted:
                wanted.add(name)
                stack.append(name)
    return wanted


def _mode(pipeline: Pipeline, internal: frozenset[str]) -> Mode:
    plan = plan_of(pipeline)
    if plan is None or any(root.kind != "source" for root in plan.roots):
        return "partitions"
    if any(node.op not in STATELESS for node in plan.steps if node.op not in ("to", "aggregate")):
        return "partitions"
    for sink in plan.sinks:
        if sink.kind == "apply":
            return "partitions"
        if sink.kind == "to" and sink.node.params["topic"] in internal:
            return "partitions"
        if sink.kind == "send":
            aggregation: Aggregation = sink.node.params["aggregation"]
            window = sink.node.params["window"]
            if aggregation.merge is None or (window is not None and window.grace_ms is not None):
                return "partitions"
    return "chunks"


def silent_with(pipeline: Pipeline, empty: frozenset[str]) -> bool:
    """Whether a pipeline can produce nothing on a partition where the topics ``empty``
    hold no record: every sink lies downstream of a stream join one side of which reads
    such a topic (with no record on a side, a join has no pair, and its left records are
    never given up on: the right side's event time never moves)."""
    plan = plan_of(pipeline)
    if plan is None or not plan.sinks or not empty:
        return False
    return all(_silent_join_above(sink.node, empty) for sink in plan.sinks)


def _silent_join_above(node: Node, empty: frozenset[str]) -> bool:
    stack = list(node.parents)
    while stack:
        current = stack.pop()
        if current.op == "join_stream" and any(
            _source_topic(side) in empty for side in current.parents
        ):
            return True
        stack.extend(current.parents)
    return False


def _source_topic(node: Node) -> str | None:
    """The topic a join's side comes from (its inputs come straight from a source)."""
    while node.op != "source":
        node = node.parents[0]
    topic: str | None = node.params.get("topic")
    return topic


def _joined(node: Node) -> bool:
    """Whether a stream join lies upstream of a step."""
    stack = list(node.parents)
    while stack:
        current = stack.pop()
        if current.op == "join_stream":
            return True
        stack.extend(current.parents)
    return False


def _recomputed(
    table: str,
    pipeline: Pipeline,
    pipelines: Mapping[str, Pipeline],
    producers: Mapping[str, list[str]],
) -> Recomputed:
    plan = plan_of(pipeline)
    if plan is None:
        return Recomputed(
            table,
            (pipeline.name,),
            "its batch function replayed per partition, in offset order",
            "a batch function must not depend on where its batches end (the replay's "
            "batches are not the stream's)",
        )
    sink = next(s for s in plan.sinks if s.kind == "apply" and s.node.params["table"] == table)
    node = sink.node
    aggregation: Aggregation = node.params["aggregation"]
    senders = tuple(
        name for root in plan.roots if root.kind == "repartition" for name in producers[root.topic]
    )
    order_dependent = None
    if senders and aggregation.merge is None:
        how = (
            f"values sent one by one to its repartition topic by {', '.join(senders)}, "
            "folded per key"
        )
        order_dependent = (
            "an aggregation without a merge across a repartition topic: it folds values "
            "in the order the senders' partitions interleave"
        )
    elif senders:
        how = (
            f"combined per key in each run of records by {', '.join(senders)} (any split "
            "of the partitions), merged per key"
        )
    else:
        how = "folded per partition in offset order"
    joined = _joined(node)
    if joined:
        how += "; its stream join decided per partition over the whole log"
        if aggregation.kind in ("reduce", "aggregate"):
            order_dependent = (
                "folds a stream join's results, whose order depends on how the two topics "
                "interleave"
            )
    if plan.lookups:
        order_dependent = (
            f"reads {', '.join(plan.lookups)} as each batch finds it: the result depends "
            "on how the pipelines' batches interleave"
        )
    return Recomputed(table, (*senders, pipeline.name), how, order_dependent)
