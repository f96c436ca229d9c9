"""The composition root: the faust app, its settings and its web layer.

faust --datadir DIR -A app.main worker -l info --web-host 127.0.0.1 --web-port 6066
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import faust
from mode import ServiceT

from api import create_api
from api.server import ApiServer, LegacyWebDisabled
from app.settings import Settings

APP_ID = "streamstate"


class StreamstateApp(faust.App):
    """faust.App that also runs the FastAPI layer from the moment the worker starts."""

    settings: Settings

    def on_init_dependencies(self) -> Iterable[ServiceT]:
        deps = list(super().on_init_dependencies())
        if not (self.producer_only or self.client_only):
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
    }
    app = StreamstateApp(APP_ID, **options)
    app.settings = settings
    app.web_server(LegacyWebDisabled)
    return app


settings = Settings()
app = create_app(settings)
