"""The composition root: the faust app, its settings and its web layer.

faust --datadir DIR -A app.main worker -l info --web-host 127.0.0.1 --web-port 6066
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import faust
from mode import ServiceT

from agents import corrections, inventory, products, sales, settling, words
from agents.dlq import DeadLetters
from agents.raw import raw_topic
from api import create_api
from api.server import ApiServer, LegacyWebDisabled
from app import topics
from app.admin import ensure_topics
from app.commits import commit_before_revoke, dedupe_acked
from app.direct import DirectSource
from app.fetching import seek_back_on_skip
from app.settings import Settings
from tables.batch import BatchProcessor
from tables.catalog import ProductCatalog
from tables.checkpoint import discard_if_unclean, mark_clean
from tables.definitions import Tables, declare_tables
from tables.transactions import stop_revoked_producers

APP_ID = "streamstate"


@dataclass(frozen=True)
class Pipeline:
    """Everything the pipelines declared on the app: what the query layer reads."""

    tables: Tables
    catalog: ProductCatalog
    dead_letters: DeadLetters
    sources: dict[str, Any]
    processor: BatchProcessor
    #: stages that read a source topic with a consumer group of their own
    direct: list[DirectSource]


class StreamstateApp(faust.App):
    """faust.App that also runs the FastAPI layer from the moment the worker starts."""

    settings: Settings
    pipeline: Pipeline

    async def on_first_start(self) -> None:
        if not (self.producer_only or self.client_only):
            discard_if_unclean(
                Path(self.conf.datadir),
                Path(self.conf.tabledir),
                exactly_once=self.settings.processing_guarantee == "exactly_once",
            )
        await super().on_first_start()
        if not (self.producer_only or self.client_only):
            specs = topics.topic_specs(
                self.settings.topic_partitions, self.settings.source_retention_ms
            )
            specs += internal_topic_specs(self, {spec.name for spec in specs})
            await ensure_topics(
                self.settings.bootstrap_servers, specs, self.settings.topic_replication_factor
            )

    async def _stop_consumer(self) -> None:
        consumer: Any = self._consumer
        if self.in_transaction and consumer is not None:
            # Once the stop has committed and ended the transactions, faust's consumer
            # would commit again (on its timer while the tables close, and when it
            # stops) outside any transaction: IllegalOperation "Not in the middle of a
            # transaction", and the stop crashes.
            end = consumer.commit_and_end_transactions

            async def already_ended(*args: Any, **kwargs: Any) -> bool:
                return False

            async def commit_and_end_transactions() -> None:
                await end()
                consumer.commit = already_ended
                consumer.commit_and_end_transactions = already_ended

            consumer.commit_and_end_transactions = commit_and_end_transactions
        await super()._stop_consumer()

    async def on_shutdown(self) -> None:
        await super().on_shutdown()
        if not (self.producer_only or self.client_only) and not self.crashed:
            mark_clean(Path(self.conf.datadir))

    def _new_consumer(self) -> Any:
        consumer = super()._new_consumer()
        seek_back_on_skip(consumer)
        commit_before_revoke(consumer)
        dedupe_acked(consumer)
        stop_revoked_producers(consumer)
        self.pipeline.processor.install_skip_watch(consumer)
        return consumer

    def on_init_dependencies(self) -> Iterable[ServiceT]:
        deps = list(super().on_init_dependencies())
        if not (self.producer_only or self.client_only):
            deps.append(self.pipeline.catalog)
            deps.extend(self.pipeline.direct)
            # The worker CLI has set web_host/web_port by now; they are the canonical URL.
            deps.append(
                ApiServer(
                    create_api(self),
                    host=self.conf.web_host,
                    port=self.conf.web_port,
                    loop=self.loop,
                    beacon=self.beacon,
                )
            )
        return deps


def create_app(settings: Settings) -> StreamstateApp:
    """Build the faust app from the settings."""
    options: dict[str, Any] = {
        "broker": settings.broker_url,
        "store": "rocksdb://",
        "datadir": str(settings.datadir),
        "web_host": settings.web_host,
        "web_port": settings.web_port,
        "table_standby_replicas": settings.table_standby_replicas,
        "processing_guarantee": settings.processing_guarantee,
        "topic_partitions": settings.topic_partitions,
        "topic_replication_factor": settings.topic_replication_factor,
        "broker_session_timeout": settings.broker_session_timeout,
        "broker_heartbeat_interval": settings.broker_heartbeat_interval,
        "broker_rebalance_timeout": settings.broker_rebalance_timeout,
        "consumer_auto_offset_reset": "earliest",
        "autodiscover": False,
        "web_enabled": True,
        "TableManager": "tables.restore:StreamstateTableManager",
    }
    app = StreamstateApp(APP_ID, **options)
    app.settings = settings
    app.web_server(LegacyWebDisabled)
    app.pipeline = build_pipeline(app, settings)
    return app


def internal_topic_specs(app: faust.App, known: set[str]) -> list[topics.TopicSpec]:
    """The repartition and changelog topics faust would create itself.

    They are created before the consumer subscribes: a topic that appears after the
    first assignment is left out of it ("Ignoring missing topic"), and its records wait
    for the next rebalance.
    """
    channels: list[Any] = [agent.channel for agent in app.agents.values()]
    channels += [table.changelog_topic for table in app.tables.values()]
    leader: Any = app._leader_assignor
    channels.append(leader._leader_topic)
    specs: dict[str, topics.TopicSpec] = {}
    for channel in channels:
        if not getattr(channel, "internal", False):
            continue
        config = {str(k): str(v) for k, v in (channel.config or {}).items()}
        if channel.compacting:
            config["cleanup.policy"] = "compact,delete" if channel.deleting else "compact"
        if channel.retention is not None:
            config["retention.ms"] = str(int(channel.retention * 1000))
        partitions = channel.partitions or app.conf.topic_partitions
        for name in channel.topics:
            if name not in known:
                specs[name] = topics.TopicSpec(name, partitions, config)
    return list(specs.values())


def source_topics(app: faust.App, settings: Settings) -> dict[str, Any]:
    """The source topics, raw bytes in and out: the agents validate every record."""
    return {
        spec.name: raw_topic(app, spec)
        for spec in topics.topic_specs(settings.topic_partitions, settings.source_retention_ms)
        if spec.name in topics.SOURCE_TOPICS
    }


def build_pipeline(app: StreamstateApp, settings: Settings) -> Pipeline:
    """Declare topics, tables and agents of the reference pipelines."""
    sources = source_topics(app, settings)
    tables = declare_tables(app, settings)
    dlq = DeadLetters(
        app, list(topics.SOURCE_TOPICS), settings.topic_partitions, settings.source_retention_ms
    )
    catalog = ProductCatalog(
        bootstrap=settings.bootstrap_servers,
        topic=topics.PRODUCTS,
        path=Path(app.conf.datadir) / "catalog" / "products",
    )
    processor = BatchProcessor(app)
    revoked: Any = app.on_partitions_revoked
    revoked.connect(processor.on_revoked_signal)
    split_lines = words.register(app, settings, tables.word_counts, dlq, processor)
    sales_feed = inventory.register(
        app, settings, sources[topics.ITEM_EVENTS], tables.inventory, catalog, dlq, processor
    )
    sales.register(app, settings, sales_feed, tables.sales_by_category, processor)
    products.register(app, settings, sources[topics.PRODUCTS], dlq)
    corrections.register(app, settings, tables, processor)
    settling.register(app, settings, tables.unsettled_sales, dlq, processor)

    async def flush_standby_buffers() -> None:
        # faust buffers 1,000 standby updates per partition before writing them: without
        # this a standby could serve minutes-old values.
        recovery: Any = getattr(app.tables, "recovery", None)
        if recovery is not None:
            recovery.flush_buffers()

    app.timer(settings.standby_flush_interval, name="flush_standby_buffers")(flush_standby_buffers)

    return Pipeline(
        tables=tables,
        catalog=catalog,
        dead_letters=dlq,
        sources=sources,
        processor=processor,
        direct=[split_lines],
    )


settings = Settings()
app = create_app(settings)
