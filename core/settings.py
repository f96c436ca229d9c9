"""The one Settings object: read from the environment once, then passed down.

Where faust has an environment name for a setting we read that same name, so that a
worker configured for plain faust behaves the same here; settings faust lacks use the
``STREAMSTATE_`` prefix.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

Guarantee = Literal["at_least_once", "exactly_once"]


def _env(name: str) -> AliasChoices:
    return AliasChoices(name, name.lower())


class Settings(BaseSettings):
    """Worker and job configuration, from the environment."""

    model_config = SettingsConfigDict(env_prefix="STREAMSTATE_", extra="ignore", frozen=True)

    # faust's own environment names
    broker_url: str = Field("kafka://127.0.0.1:9092", validation_alias=_env("BROKER_URL"))
    #: ``faust --datadir`` sets FAUST_DATADIR when faust is imported; it wins.
    datadir: Path = Field(
        Path("streamstate-data"),
        validation_alias=AliasChoices("FAUST_DATADIR", "F_DATADIR", "APP_DATADIR", "datadir"),
    )
    web_host: str = Field("127.0.0.1", validation_alias=_env("WEB_HOST"))
    web_port: int = Field(6066, ge=1, le=65535, validation_alias=_env("WEB_PORT"))
    table_standby_replicas: int = Field(1, ge=0, validation_alias=_env("TABLE_STANDBY_REPLICAS"))
    processing_guarantee: Guarantee = Field(
        "at_least_once", validation_alias=_env("PROCESSING_GUARANTEE")
    )
    topic_partitions: int = Field(8, ge=1, validation_alias=_env("TOPIC_PARTITIONS"))
    topic_replication_factor: int = Field(
        1, ge=1, validation_alias=_env("TOPIC_REPLICATION_FACTOR")
    )
    #: The worker's static group membership (KIP-345): a worker that restarts with the
    #: same id takes its partitions back without a rebalance. Default: its canonical URL
    #: (unique in the group, as peers route reads to it); empty: dynamic membership.
    group_instance_id: str | None = Field(None, validation_alias=_env("CONSUMER_GROUP_INSTANCE_ID"))
    broker_session_timeout: float = Field(
        10.0, gt=0, validation_alias=_env("BROKER_SESSION_TIMEOUT")
    )
    #: Members learn of a rebalance at their next heartbeat: a restarted worker's join
    #: waits for the slowest of them, so a short interval shortens every restart.
    broker_heartbeat_interval: float = Field(
        0.25, gt=0, validation_alias=_env("BROKER_HEARTBEAT_INTERVAL")
    )
    broker_rebalance_timeout: float = Field(
        20.0, gt=0, validation_alias=_env("BROKER_REBALANCE_TIMEOUT")
    )

    # streamstate's own (STREAMSTATE_ prefix)
    api_token: str | None = None
    #: Retention of the source topics, in ms; -1 keeps them forever (the batch job
    #: recomputes from them).
    source_retention_ms: int = -1
    #: Largest accepted event value, in bytes; larger ones go to the DLQ.
    max_event_bytes: int = Field(64 * 1024, gt=0)
    #: A batch cycle takes at most this many records per fetch.
    source_fetch_max_records: int = Field(20_000, gt=0)
    #: The longest the broker holds a fetch of the group's consumer that finds nothing
    #: new, in ms (faust's is 1,500). The consumer has one fetch in flight per broker, and
    #: it leaves out the partitions whose last records the engine has not taken yet: one
    #: sent while a cycle runs waits this long before the partitions it left out, whose
    #: records keep arriving, are fetched again.
    source_fetch_max_wait_ms: int = Field(100, ge=0, le=10_000)
    #: The same for a fetch that leaves out no partition (none holds records the engine
    #: has not taken, none is paused or without a position), in ms: the broker answers
    #: it as soon as any of its partitions has a record, so a long hold delays nothing,
    #: and an idle worker's consumer does not wake ten times a second for nothing.
    source_fetch_idle_wait_ms: int = Field(1_500, ge=0, le=10_000)
    #: The pipeline modules to run, comma-separated: importable modules, each with a
    #: ``pipelines(context)`` function (the worker and the nightly job load the same).
    pipelines: str = "agents.words,agents.inventory,agents.sales,agents.settling"
    #: More pipeline modules to run, comma-separated (added to ``pipelines``).
    extra_pipelines: str = ""
    #: Size of each table partition's RocksDB memtable, in MiB. A worker killed -9
    #: replays the write-ahead log of every unflushed memtable when it opens its
    #: databases again, on the way to ready; small memtables keep that log short
    #: (RocksDB flushes them in its own threads) and cost less CPU per write here than
    #: faust's 64 MiB.
    rocksdb_write_buffer_mb: int = Field(4, ge=1)
    #: How often standby updates are flushed to RocksDB, in seconds.
    standby_flush_interval: float = Field(0.5, gt=0)
    #: Warm handover (tables/warmups.py): an active partition moves to another member
    #: only once that member's copy is at most ``acceptable_recovery_lag`` changelog
    #: records behind; until then it warms up there as a standby and the partition stays
    #: with its owner. False moves partitions where faust's assignor puts them at once.
    warm_handover: bool = True
    acceptable_recovery_lag: int = Field(10_000, ge=0)
    #: A member whose warm-ups are not all within the lag asks for the rebalance that
    #: moves them this long after its assignment, once some are (seconds).
    warmup_probe_s: float = Field(10.0, gt=0)
    #: Remove a peer from the group as soon as its port refuses connections this many
    #: probes in a row (0.5 s apart): its process is gone (api/members.py). Three span
    #: at least a second: a worker started again at once takes its port (app/listen.py)
    #: after Python has imported faust, about half a second of CPU, and is not removed.
    evict_dead_members: bool = True
    #: A static member that stops (SIGTERM) leaves its group once its last cycle is
    #: committed, as its consumer closes (LeaveGroup v3 naming its instance id): the group
    #: hands its partitions on at once, instead of after its peers' probes or its session.
    #: False keeps them waiting for it, so that a restart in place takes them back with no
    #: rebalance (a kill -9 never leaves).
    leave_group_on_stop: bool = True
    dead_member_probes: int = Field(3, ge=1)
    #: A state the Kafka client logs as an error but the worker waits out (a coordinator
    #: not available yet, a rebalance, a broker out of reach) is logged at INFO until it
    #: has lasted this long, in seconds, then once at WARNING (core/logs.py).
    log_transient_grace_s: float = Field(20.0, ge=0)
    #: How long a forwarded key read may take before a standby answers, in seconds.
    forward_timeout: float = Field(1.0, gt=0)
    #: The most change streams a worker relays from its peers at once (each holds a
    #: connection to the key's owner, about two file descriptors with the client's); one
    #: more waits for one of them to end, and is a 503 naming this bound if none ends in
    #: time.
    relayed_streams: int = Field(4096, ge=1)
    #: The worker's garbage collector thresholds (``gc.set_threshold``): a batch cycle
    #: allocates hundreds of thousands of short-lived objects, and CPython's defaults
    #: (700, 10, 10) spend a quarter of the worker's time collecting them.
    gc_thresholds: tuple[int, int, int] = (100_000, 50, 100)
    #: Windowed tables keep a window this long by default, in days.
    window_retention_days: float = Field(7.0, gt=0)
    nightly_cron: str = "0 2 * * *"
    #: Where the nightly scheduler writes each run's folder with its report.json, and
    #: where a worker's console finds the newest report (a report file works too).
    nightly_reports: Path = Path(".data/nightly")
    #: The Spark master the nightly job runs on (``spark://host:7077``, ``yarn``,
    #: ``k8s://https://...``); the job ships its Python environment to a cluster's executors.
    spark_master: str = "local[*]"

    @field_validator("broker_url")
    @classmethod
    def _broker_has_scheme(cls, value: str) -> str:
        return value if "://" in value else f"kafka://{value}"

    @property
    def exactly_once(self) -> bool:
        """The processing guarantee, decided here once: the engine runs a transaction
        per cycle and every reader of its topics reads ``read_committed``."""
        return self.processing_guarantee == "exactly_once"

    @property
    def extra_pipeline_modules(self) -> list[str]:
        return [name.strip() for name in self.extra_pipelines.split(",") if name.strip()]

    @property
    def pipeline_modules(self) -> list[str]:
        """Every pipeline module to load, in order, each once."""
        named = [name.strip() for name in self.pipelines.split(",") if name.strip()]
        return list(dict.fromkeys([*named, *self.extra_pipeline_modules]))

    @property
    def bootstrap_servers(self) -> str:
        """The broker list without faust's ``kafka://`` scheme, for plain Kafka clients."""
        return ",".join(
            part.split("://", 1)[-1] for part in self.broker_url.split(";") if part.strip()
        )
