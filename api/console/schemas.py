"""Response and request models of the console's routes (their OpenAPI shapes)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

# -- GET /topology ------------------------------------------------------------------------


class TopologyNode(BaseModel):
    id: str = Field(description="`topic:<name>`, `table:<name>` or `step:<pipeline>[/<step>]`.")
    kind: Literal["source", "step", "repartition", "table", "output", "dead-letter"]
    label: str
    pipeline: str | None = Field(None, description="Steps: the pipeline they belong to.")
    step: str | None = Field(None, description="Steps of a pipeline's own graph: their kind.")
    table_kind: Literal["table", "windowed", "global", "internal"] | None = Field(
        None, description="Tables: how the API serves them (internal: not served)."
    )
    queryable: bool | None = None
    lag_records: int | None = Field(
        None, description="Sources and repartition topics: records the group has not applied."
    )
    lag_ms: int | None = Field(
        None, description="Sources and repartition topics: age of the oldest of them."
    )


class TopologyEdge(BaseModel):
    model_config = {"populate_by_name": True}

    source: str = Field(alias="from", serialization_alias="from")
    to: str
    records_per_s: float | None = Field(
        description="Records read (topic to step), keys written (step to table) or records "
        "sent (step to topic) per second by the whole group; null where not measured."
    )
    pipeline: str


class Topology(BaseModel):
    nodes: list[TopologyNode]
    edges: list[TopologyEdge]
    sampled_over_s: float = Field(description="The window the rates are measured over.")
    members: int = Field(description="Members whose figures are added up.")
    unreachable: list[str] = Field(description="Members that did not report.")


# -- GET /group ---------------------------------------------------------------------------


class Copy(BaseModel):
    table: str
    partition: int
    replica: Literal["active", "standby"]
    lag_records: int | None = Field(description="Input records the copy has not applied.")
    lag_ms: int | None = Field(description="Age of the oldest of them.")
    changelog_lag: int | None = Field(description="Changelog records not yet in the copy.")


class SourcePartition(BaseModel):
    topic: str
    partition: int
    next_offset: int | None
    end_offset: int | None
    lag_records: int | None
    lag_ms: int | None


class RestorePartition(BaseModel):
    table: str
    partition: int
    offset: int | None
    highwater: int | None
    remaining: int | None


class Restore(BaseModel):
    in_progress: bool
    remaining_total: int
    partitions: list[RestorePartition]
    stats: dict[str, Any] | None


class RebalanceEntry(BaseModel):
    number: int
    started_at: float = Field(description="Epoch seconds.")
    returned_at: float | None
    ended_at: float | None
    generation: int | None
    join_s: float | None = Field(description="Start until the group's answer.")
    paused_s: float = Field(description="Start until processing resumed (so far, if running).")
    in_progress: bool


class Rate(BaseModel):
    pipeline: str
    topic: str | None = None
    table: str | None = None
    per_s: float


class Rates(BaseModel):
    seconds: float
    read: list[Rate]
    written: list[Rate]
    sent: list[Rate]


class HistoryPoint(BaseModel):
    at: float = Field(description="Epoch seconds.")
    read: float = Field(description="Records/s the worker's pipelines applied.")
    sent: float = Field(description="Records/s they sent.")


class Member(BaseModel):
    url: str
    reachable: bool
    status: str = Field(
        description="running, idle, recovering, rebalancing, failed, or unreachable."
    )
    failure: str | None = None
    generation: int | None = None
    sampled_at: float | None = None
    active: dict[str, list[int]] = Field(default_factory=dict, description="table: partitions")
    standby: dict[str, list[int]] = Field(default_factory=dict, description="table: partitions")
    copies: list[Copy] = Field(default_factory=list)
    sources: list[SourcePartition] = Field(default_factory=list)
    restore: Restore | None = None
    rebalances: list[RebalanceEntry] = Field(default_factory=list)
    rates: Rates | None = None
    history: list[HistoryPoint] = Field(default_factory=list)


class Group(BaseModel):
    partitions: int
    members: list[Member]


# -- GET /dead-letters, POST /dead-letters/replay -----------------------------------------


class Bytes(BaseModel):
    text: str | None = Field(description="The bytes as UTF-8 text, when they are.")
    base64: str | None = Field(description="The bytes in base64, when they are not text.")
    bytes: int
    truncated: bool = Field(description="Only the first bytes are shown.")


class DeadLetterSource(BaseModel):
    topic: str | None
    partition: int | None
    offset: int | None


class DeadLetterRecord(BaseModel):
    topic: str
    partition: int
    offset: int
    timestamp: int
    key: Bytes
    value: Bytes
    error: str | None = Field(description="The `error` header: why it was refused.")
    source: DeadLetterSource
    replayed_from: str | None = Field(
        description="A replay sent it back here: the dead letter it came from."
    )
    replay: dict[str, Any] | None = Field(
        description="Its replay, from the replay log (status, to, by, at), or null."
    )


class DeadLetterTopic(BaseModel):
    topic: str
    source: str
    records: int = Field(description="Records the topic holds up to now (its end offsets).")


class DeadLetters(BaseModel):
    topics: list[DeadLetterTopic]
    records: list[DeadLetterRecord] = Field(description="The latest, newest first.")


class ReplayTarget(BaseModel):
    topic: str = Field(min_length=1, max_length=249, description="A `<topic>-dlq` topic.")
    partition: int = Field(ge=0)
    offset: int = Field(ge=0)


class ReplayRequest(BaseModel):
    records: list[ReplayTarget] = Field(min_length=1, max_length=100)
    apply_to_all: bool = Field(
        False,
        description="Replay dead letters of a step that raised in one pipeline even though "
        "other pipelines reading the topic applied the record: they apply it again.",
    )


class Where(BaseModel):
    topic: str
    partition: int
    offset: int


class ReplayResult(BaseModel):
    topic: str
    partition: int
    offset: int
    status: Literal["replayed", "dead-lettered", "refused"] = Field(
        description="replayed: sent to its source topic; dead-lettered: still invalid, sent "
        "back to its dead-letter topic; refused: another worker replayed it a moment before."
    )
    to: Where | None
    detail: str | None


class Replayed(BaseModel):
    results: list[ReplayResult]


# -- GET /nightly -------------------------------------------------------------------------


class NightlyTable(BaseModel):
    name: str
    recomputed: bool
    keys_compared: int | None = None
    differing: int | None = None
    mismatched: int | None = None
    missing_in_stream: int | None = None
    missing_in_batch: int | None = None
    repaired: int | None = Field(None, description="Corrections published by --repair.")
    examples: list[dict[str, Any]] = Field(default_factory=list)


class NightlyReport(BaseModel):
    path: str
    ran_at: int = Field(description="Epoch ms: when the run took its offset cut.")
    written_at: int = Field(description="Epoch ms: when the report was written.")
    seconds: float | None = Field(description="How long the run took.")
    differs: bool
    cut_settled: bool | None
    group_lag: Any = None
    corrections_published: int
    tables: list[NightlyTable]


class Nightly(BaseModel):
    looked_in: str
    report: NightlyReport | None
    detail: str | None
