"""The composition root: the faust app, its settings, the engine and its pipelines, and
the web layer.

faust --datadir DIR -A app.main worker -l info --web-host 127.0.0.1 --web-port 6066
"""

from __future__ import annotations

import gc
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import faust
from mode import ServiceT

import app as app_package
from app import listen
from app.web import DeferredApi, LegacyWebDisabled
from core import topics
from core.admin import ensure_topics
from core.logs import install_transient_states
from core.settings import Settings
from streams.corrections import corrections_pipeline
from streams.loading import Loaded, load
from tables.definitions import Tables, declare_tables
from tables.engine import Engine
from tables.faust_adapter import (
    EngineApp,
    EngineService,
    FaustConnector,
    FaustMembership,
    FaustTableStore,
    StandbyFlusher,
    check_versions,
    internal_channels,
    on_partitions_assigned,
    on_partitions_revoked,
)
from tables.global_table import GlobalTableService
from tables.membership import ServedTable, WorkerView
from tables.pipeline import Context, Pipeline, SourceSpec
from tables.rebalances import RebalanceLog
from tables.warmups import WarmupWatch

APP_ID = "streamstate"


@dataclass(frozen=True)
class Wiring:
    """What the composition root built: what the query layer and the metrics read."""

    tables: Tables
    #: every global table, by name
    globals: dict[str, GlobalTableService]
    #: every pipeline the engine runs, the corrections included
    pipelines: list[Pipeline]
    loaded: Loaded
    #: the topics records may be written to (POST /topics), with their declared types
    inputs: dict[str, SourceSpec | None]
    engine: Engine
    #: every table's store, by name: the engine writes through them, the API reads
    stores: dict[str, FaustTableStore]
    connector: FaustConnector
    #: the worker's last rebalances (a faust sensor: added before the worker starts, as
    #: faust keeps each sensor's state from a rebalance's start to its return)
    rebalances: RebalanceLog


class StreamstateApp(EngineApp):
    """faust.App whose records go to the engine, with the FastAPI layer running from the
    moment the worker starts."""

    settings: Settings
    wiring: Wiring

    @property
    def engine(self) -> Engine:
        return self.wiring.engine

    def view(self) -> WorkerView:
        """What the HTTP API is given of this worker."""
        wiring = self.wiring
        return WorkerView(
            settings=self.settings,
            membership=FaustMembership(
                self, bootstrap=self.settings.bootstrap_servers, rebalances=wiring.rebalances
            ),
            engine=wiring.engine,
            stores=wiring.stores,
            served={
                name: ServedTable(name, info.kind, self.settings.topic_partitions, info.spec.window)
                for name, info in wiring.tables.infos().items()
            },
            globals=wiring.globals,
            inputs=wiring.inputs,
            pipelines=wiring.pipelines,
        )

    async def on_first_start(self) -> None:
        await super().on_first_start()
        if not (self.producer_only or self.client_only):
            # What the start-up allocated lives as long as the worker: out of the
            # collector's way for good, and the cycles' garbage collected less often.
            gc.freeze()
            gc.set_threshold(*self.settings.gc_thresholds)
            loaded = self.wiring.loaded
            specs = topics.topic_specs(
                loaded.inputs,
                [spec.topic for spec in loaded.globals.values()],
                self.settings.topic_partitions,
                self.settings.source_retention_ms,
            )
            specs += internal_topic_specs(
                self, self.wiring.pipelines, {spec.name for spec in specs}
            )
            await ensure_topics(
                self.settings.bootstrap_servers, specs, self.settings.topic_replication_factor
            )

    def on_init_dependencies(self) -> Iterable[ServiceT]:
        # The worker CLI has set web_host/web_port by now: the canonical URL is final, and
        # the group's consumer is created below.
        instance = self.settings.group_instance_id
        if instance is None:
            instance = str(self.conf.canonical_url)
        conf: Any = self.conf
        conf.consumer_group_instance_id = instance or None
        deps = list(super().on_init_dependencies())
        if not (self.producer_only or self.client_only):
            deps.extend(self.wiring.globals.values())
            deps.append(EngineService(self.wiring.engine))
            deps.append(
                StandbyFlusher(self, self.wiring.engine, self.settings.standby_flush_interval)
            )
            deps.append(WarmupWatch(self, probe_after_s=self.settings.warmup_probe_s))
            # The worker CLI has set web_host/web_port by now; they are the canonical URL.
            # The process took that port at its start (app/listen.py).
            tables: Any = self.tables  # a StreamstateTableManager
            # FastAPI's modules are imported once the worker is ready: a restarted
            # worker answers /ready and key reads without them.
            api = DeferredApi(
                self.view(),
                host=self.conf.web_host,
                port=self.conf.web_port,
                sock=listen.take(self.conf.web_host, self.conf.web_port),
                full_api_after=tables.recovery.recovered.wait,
                loop=self.loop,
                beacon=self.beacon,
            )
            deps.append(api)
            # Standby databases open once reads are served: the opens hold the GIL that
            # the API's import in a thread needs.
            tables.recovery.standbys_after = api.serving.wait
            # ... and after a rebalance, once the active tasks' first cycle has ended.
            tables.recovery.actives_first = self.engine.next_cycle
            # Under exactly_once the partitions kept from the last generation need no
            # read of their changelogs' last commit markers.
            tables.recovery.stores_epoch = self.engine.stores_epoch
        return deps


def create_app(settings: Settings) -> StreamstateApp:
    """Build the faust app from the settings."""
    check_versions()
    options: dict[str, Any] = {
        "broker": settings.broker_url,
        "store": "rocksdb://",
        "datadir": str(settings.datadir),
        "web_host": settings.web_host,
        "web_port": settings.web_port,
        "table_standby_replicas": settings.table_standby_replicas,
        "topic_partitions": settings.topic_partitions,
        "topic_replication_factor": settings.topic_replication_factor,
        "broker_session_timeout": settings.broker_session_timeout,
        "broker_heartbeat_interval": settings.broker_heartbeat_interval,
        "broker_rebalance_timeout": settings.broker_rebalance_timeout,
        "broker_max_poll_records": settings.source_fetch_max_records,
        "consumer_max_fetch_size": 4 * 1024 * 1024,
        "consumer_auto_offset_reset": "earliest",
        "autodiscover": False,
        # Every topic is created once, at start, by ensure_topics (on_first_start above);
        # faust would otherwise ask the broker again for each of its own topics, one by
        # one, before the worker joins its group.
        "topic_allow_declare": False,
        "web_enabled": True,
        "TableManager": "tables.faust_adapter:StreamstateTableManager",
        "Table": "tables.faust_adapter:EngineTable",
        "PartitionAssignor": "tables.warmups:WarmupAssignor",
    }
    app = StreamstateApp(APP_ID, **options)
    # The engine runs the transactions itself under exactly_once (tables/engine.py), so
    # faust runs at least once, and its group's consumer reads what they commit. Set
    # here, not as an App option: faust reads PROCESSING_GUARANTEE from the environment
    # over its options, and would then start transactional producers of its own at
    # every rebalance.
    conf: Any = app.conf
    conf.processing_guarantee = "at_least_once"
    app.settings = settings
    app.read_committed = settings.exactly_once
    app.web_server(LegacyWebDisabled)
    app.wiring = build(app, settings)
    return app


def internal_topic_specs(
    app: faust.App, pipelines: Sequence[Pipeline], known: set[str]
) -> list[topics.TopicSpec]:
    """The changelog, repartition and dead-letter topics that the pipelines need.

    They are created before the consumer subscribes: a topic that appears after the
    first assignment is left out of it ("Ignoring missing topic"), and its records wait
    for the next rebalance.
    """
    channels = internal_channels(app)
    partitions = app.conf.topic_partitions
    specs: dict[str, topics.TopicSpec] = {}
    for channel in channels:
        config = {str(k): str(v) for k, v in (channel.config or {}).items()}
        if channel.compacting and "cleanup.policy" not in config:
            config["cleanup.policy"] = "compact,delete" if channel.deleting else "compact"
        if channel.retention is not None:
            config["retention.ms"] = str(int(channel.retention * 1000))
        for name in channel.topics:
            if name not in known:
                specs[name] = topics.TopicSpec(name, channel.partitions or partitions, config)
    retained = {"retention.ms": str(app.settings.source_retention_ms)}  # type: ignore[attr-defined]
    # Every topic a pipeline reads or sends to (repartition topics, and the sources of
    # added pipelines), and the dead-letter topic of each one it reads.
    named = {t for p in pipelines for t in (*p.reads, *p.produces)}
    named |= {topics.dlq_topic(t) for p in pipelines for t in p.reads}
    for topic in sorted(named - known - set(specs)):
        specs[topic] = topics.TopicSpec(topic, partitions, dict(retained))
    return list(specs.values())


def source_channel(app: faust.App, name: str) -> Any:
    """A topic the group subscribes to, raw bytes: the engine reads its records."""
    return app.topic(
        name, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw"
    )


def build(app: StreamstateApp, settings: Settings) -> Wiring:
    """Load the pipelines, declare their tables and global tables, and the engine that
    runs them."""
    global_tables: dict[str, GlobalTableService] = {}
    context = Context(
        partitions=settings.topic_partitions,
        max_event_bytes=settings.max_event_bytes,
        window_retention_ms=int(settings.window_retention_days * 86_400_000),
        app_id=str(app.conf.id),
        global_tables=global_tables,
    )
    loaded = load(settings.pipeline_modules, context)
    for name, spec in loaded.globals.items():
        global_tables[name] = GlobalTableService(
            spec,
            bootstrap=settings.bootstrap_servers,
            path=Path(app.conf.datadir) / "globals" / name,
            max_bytes=settings.max_event_bytes,
        )
    pipelines = list(loaded.pipelines)
    corrections = corrections_pipeline(loaded.tables)
    if corrections is not None:
        pipelines.append(corrections)
    tables = declare_tables(app, settings, [spec for p in pipelines for spec in p.writes])

    async def prepare() -> None:
        for table in global_tables.values():
            await table.wait_caught_up()

    connector = FaustConnector(app, bootstrap=settings.bootstrap_servers, prepare=prepare)
    stores = tables.stores()
    connector.watch_tables([store.changelog_topic for store in stores.values()])
    engine = Engine(
        pipelines,
        stores,
        connector,
        partitions=settings.topic_partitions,
        exactly_once=settings.exactly_once,
    )
    # The group subscribes to every topic the engine reads.
    for name in sorted(engine.topics):
        app.topics.add(source_channel(app, name))
    revoked: Any = app.on_partitions_revoked

    async def on_revoked(sender: Any, revoked_tps: Any, **kwargs: Any) -> None:
        await on_partitions_revoked(engine)

    revoked.connect(on_revoked, weak=False)
    assigned: Any = app.on_partitions_assigned

    async def on_assigned(sender: Any, assigned: Any, **kwargs: Any) -> None:
        await on_partitions_assigned(engine, assigned)

    assigned.connect(on_assigned, weak=False)
    inputs = {topic: loaded.sources.get(topic) for topic in sorted(loaded.inputs)}
    rebalances = RebalanceLog()
    app.sensors.add(rebalances)
    return Wiring(
        tables, global_tables, pipelines, loaded, inputs, engine, stores, connector, rebalances
    )


settings = Settings()
install_transient_states(settings.log_transient_grace_s)
app = create_app(settings)

if app_package.COLLECTING:  # off while the modules were imported (app/__init__.py)
    gc.enable()
