"""Build the FastAPI application of a worker."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from prometheus_client import CollectorRegistry

from api.docs import add_docs
from api.errors import register_handlers
from api.middleware import LatencyMiddleware
from api.peers import Peers
from api.producer import RecordProducer
from api.queries import Queries
from api.routes import health, internal, metadata, metrics, tables, topics
from api.routing import normalize_url
from api.scans import Scans
from app.metrics import WorkerCollector


def create_api(worker: Any) -> FastAPI:
    """Create the HTTP API of one worker.

    ``worker`` is the faust app; routes reach it through ``request.app.state.worker``.
    """
    settings = worker.settings
    peers = Peers(
        normalize_url(worker.conf.canonical_url), settings.api_token, settings.forward_timeout
    )

    producer = RecordProducer(settings.bootstrap_servers, client_id=f"{worker.conf.id}-api")

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        producer.warm_up()
        yield
        await producer.stop()
        await peers.close()

    api = FastAPI(
        title="streamstate",
        summary="Interactive queries over the stream processor's tables, and writes to "
        "its source topics",
        version="0.1.0",
        default_response_class=JSONResponse,
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
    )
    add_docs(api)
    api.state.worker = worker
    api.state.producer = producer
    api.state.queries = queries = Queries(worker, peers)
    api.state.scans = Scans(queries)
    api.state.worker_registry = registry = CollectorRegistry(auto_describe=False)
    registry.register(WorkerCollector(worker))
    register_handlers(api)
    api.add_middleware(LatencyMiddleware)
    for module in (health, tables, topics, metadata, internal, metrics):
        api.include_router(module.router)
    return api
