"""Response models of the HTTP API (they document /openapi.json and /docs)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Replica = Literal["active", "standby", "global"]


class ErrorDetail(BaseModel):
    detail: str


class NotYetDetail(BaseModel):
    detail: str
    position: dict[str, Any] = Field(description="The position the best copy reached.")
    waiting_for: dict[str, dict[str, int]] = Field(
        description="The token's positions (topic, partition, offset) it did not reach."
    )


class StaleDetail(BaseModel):
    detail: str
    position: dict[str, Any] | None = Field(
        description="The position of the copy that was beyond the bound, when one answered."
    )


class TableDescription(BaseModel):
    name: str
    kind: Literal["table", "windowed", "global"]
    partitions: int
    changelog_topic: str = Field(description="For a global table, the topic it is kept from.")
    standby_replicas: int
    window: dict[str, Any] | None = Field(
        None,
        description="A windowed table's windows: kind (tumbling, hopping or session), size_ms, "
        "advance_ms, gap_ms, grace_ms, retention_ms as they apply.",
    )


class TableList(BaseModel):
    tables: list[TableDescription]


class TopicDescription(BaseModel):
    name: str
    value_type: str = Field(description="How values are checked: text, json, bytes or a model.")
    key_field: str | None = Field(description="The field of the value the key must equal.")
    timestamp_field: str | None = Field(description="The field holding the event time (ms).")
    tombstones: bool = Field(description="Whether a null value deletes the key.")


class TopicList(BaseModel):
    topics: list[TopicDescription]


class ReadPosition(BaseModel):
    """How far the answering copy of a table partition goes."""

    partition: int
    applied: dict[str, dict[str, int]] = Field(
        description="Per source topic and partition that feeds this table partition, the "
        "first offset whose effect the copy does not hold yet (through the repartition "
        "topics too: every partition of a source re-keyed into a table feeds every "
        "partition of that table; a global table's partition is fed by that partition of "
        "its topic)."
    )
    lag_records: int | None = Field(
        description="Records of the partition's inputs the copy has not applied "
        "(None: the inputs' end offsets are not known yet)."
    )
    lag_ms: int | None = Field(
        description="Age of the oldest of them, in ms (0 when caught up); as fine as the "
        "half-second refresh of the inputs' end offsets."
    )


class Served(BaseModel):
    table: str
    key: str
    partition: int
    served_by: str = Field(description="Canonical URL of the worker whose copy answered.")
    replica: Replica
    offset_lag: int | None = Field(
        description="Changelog records the answering copy has not applied (None: unknown)."
    )
    position: ReadPosition | None = Field(
        None,
        description="Source offsets the answering copy holds (of a global table: this "
        "worker's copy, in the table's own topic).",
    )


class WindowSpan(BaseModel):
    start: int = Field(description="Window start, epoch ms (inclusive).")
    end: int = Field(description="Window end, epoch ms (exclusive).")


class KeyValue(Served):
    value: Any
    window: WindowSpan | None = Field(
        None, description="For a windowed table: the window that holds `at`."
    )


class WindowValue(WindowSpan):
    value: Any


class KeyWindows(Served):
    windows: list[WindowValue]


class ScanItem(BaseModel):
    key: str
    value: Any


class ScanPageItem(ScanItem):
    partition: int = Field(description="The key's partition: its entry in `positions`.")


class ScanPartitions(BaseModel):
    served: list[int] = Field(description="Answered by the active copy.")
    stale: list[int] = Field(description="Answered only by a standby copy.")
    missing: list[int] = Field(description="Answered by no copy: their keys are absent.")


class ScanPage(BaseModel):
    items: list[ScanPageItem]
    next_cursor: str | None
    partitions: ScanPartitions
    positions: dict[str, ReadPosition] = Field(
        default_factory=dict,
        description="Per partition that answered, the position of the copy that did.",
    )


class HostAssignment(BaseModel):
    url: str
    active: dict[str, list[int]]
    standby: dict[str, list[int]]
    reachable: bool = Field(True, description="False when the host did not report its standbys.")


class GroupMetadata(BaseModel):
    hosts: list[HostAssignment]


class KeyMetadata(BaseModel):
    table: str
    key: str
    partition: int
    active: str | None
    standbys: list[str]


class StalledPartition(BaseModel):
    """A partition whose cycle failed (it is tried again after a backoff) or has been in
    flight for 10 s or more (waiting on Kafka, or applying its records)."""

    partition: int
    #: per source topic, the offset the partition is stuck at (the next one to apply)
    inputs: dict[str, int | None]
    reason: str
    #: the name of the error (``KafkaTimeoutError``); for a cycle in flight, ``Waiting``
    #: (on Kafka) or ``Busy`` (applying its records)
    error: str
    attempts: int
    stalled_s: float
    since_ms: int
    retry_in_s: float


class Readiness(BaseModel):
    status: Literal["ready", "recovering", "broker-unreachable", "failed", "stalled"]
    assigned: int
    progress: dict[str, Any] | None = None
    detail: str | None = None
    stalled: list[StalledPartition] = []


class PartitionScan(BaseModel):
    partition: int
    replica: Replica
    offset_lag: int | None
    items: list[ScanItem]
    more: bool
    position: ReadPosition | None = None


class LocalScan(BaseModel):
    partitions: list[PartitionScan]


# -- POST /topics/{topic}/records --------------------------------------------------------


class ProduceRecord(BaseModel):
    """One record to write to a source topic."""

    model_config = ConfigDict(extra="forbid")

    key: str | None = Field(
        None,
        description="The record key (UTF-8). For a topic keyed by a field of its values "
        "(GET /topics: key_field), null means that field and any other key must equal it; "
        "other topics take any key, or none.",
    )
    value: Any = Field(
        description="A JSON value as the topic's type takes it: a JSON string for a text "
        "topic, an object for a model. A null value deletes the record named by the key on "
        "a topic that takes deletions (GET /topics: tombstones)."
    )


class ProduceRequest(BaseModel):
    """1 to 1,000 records, written all or none; the body is at most 1 MiB."""

    model_config = ConfigDict(extra="forbid")

    records: list[ProduceRecord] = Field(min_length=1, max_length=1000)


class RecordOffset(BaseModel):
    partition: int
    offset: int


class Produced(BaseModel):
    """Where each record went, in the order given, and a token naming those positions."""

    topic: str
    offsets: list[RecordOffset] = Field(description="One per record, in the request's order.")
    token: str = Field(
        description="Opaque, URL-safe, names the written positions: pass it as "
        "`consistent_with` to read a table that holds these records."
    )

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "topic": "page-views",
                    "offsets": [{"partition": 3, "offset": 1041}],
                    "token": "ATYAfesKcGFnZS12aWV3cwEAA5IIAMN-DlM",
                }
            ]
        }
    )


class RecordError(BaseModel):
    index: int | None = Field(
        description="The record's position in `records`, or null for the body as a whole."
    )
    reason: str = Field(description="What the stream would refuse, naming the field.")


class InvalidRecordsDetail(BaseModel):
    detail: str
    errors: list[RecordError]
