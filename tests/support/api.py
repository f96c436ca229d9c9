"""The FastAPI app of a worker, built around a stand-in worker, for unit tests."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from fastapi import FastAPI

from api.app import create_api
from core.settings import Settings
from streams.loading import load
from tables.engine import Engine
from tables.pipeline import Context
from tables.rebalances import RebalanceLog

APP_ID = "streamstate"


def make_api(token: str | None = None, bootstrap: str = "127.0.0.1:9", **settings: Any) -> FastAPI:
    """create_api() of a worker that has no assignment yet, with the pipelines of
    ``Settings.pipelines`` declared; ``settings`` override Settings fields."""
    config = Settings(broker_url=bootstrap, api_token=token, **settings)
    context = Context(config.topic_partitions, config.max_event_bytes, 86_400_000)
    loaded = load(config.pipeline_modules, context)
    worker = SimpleNamespace(
        conf=SimpleNamespace(canonical_url="http://127.0.0.1:6066", id=APP_ID),
        settings=config,
        # What /metrics reads of a worker before its first assignment.
        tables=SimpleNamespace(recovery=SimpleNamespace(active_remaining=dict)),
        # An engine with no pipeline: the query layer registers its listener on it.
        wiring=SimpleNamespace(
            engine=Engine([], {}, None, exactly_once=False, partitions=8),  # type: ignore[arg-type]
            inputs={topic: loaded.sources.get(topic) for topic in loaded.inputs},
            pipelines=[],
            rebalances=RebalanceLog(),
        ),
        on_partitions_revoked=SimpleNamespace(connect=lambda receiver, weak=True: None),
    )
    return create_api(worker)
