"""Build the FastAPI application of a worker."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib.metadata import version

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from api.console.page import add_console_page
from api.core import ApiCore
from api.docs import add_docs
from api.errors import QueryError
from api.middleware import HeadMiddleware, LatencyMiddleware, PathMiddleware
from api.routes import console as console_routes
from api.routes import health, internal, metadata, metrics, tables, topics
from tables.membership import WorkerView


async def _query_error(request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, QueryError)
    return JSONResponse(error.body(), error.status, headers=error.headers)


def create_api(worker: WorkerView, core: ApiCore | None = None) -> FastAPI:
    """Create the HTTP API of one worker.

    ``worker`` is all the API knows of its worker; routes reach it through
    ``request.app.state.worker``. Over a ``core`` given, the app leaves the core's start
    and stop to whoever made it (the worker's front app, api/front.py); without one, it
    makes its own and starts and stops it in its lifespan.
    """
    owned = core is None
    core = ApiCore(worker) if core is None else core

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await core.start()
        yield
        await core.stop()

    api = FastAPI(
        title="streamstate",
        summary="Interactive queries over the stream processor's tables, and writes to "
        "its source topics",
        version=version("streamstate"),
        default_response_class=JSONResponse,
        lifespan=lifespan if owned else None,
        docs_url=None,
        redoc_url=None,
    )
    add_docs(api)
    api.state.worker = worker
    api.state.hub = core.hub
    api.state.dead_members = core.dead_members
    api.state.producer = core.producer
    api.state.inputs = core.inputs
    api.state.ends = core.ends
    api.state.queries = core.queries
    api.state.scans = core.scans
    api.state.changes = core.changes
    api.state.console = core.console
    api.state.worker_registry = core.registry
    api.add_exception_handler(QueryError, _query_error)
    api.add_middleware(LatencyMiddleware)
    api.add_middleware(HeadMiddleware)
    api.add_middleware(PathMiddleware)
    for module in (health, tables, topics, metadata, internal, metrics, console_routes):
        api.include_router(module.router)
    api.include_router(topics.listing)
    api.include_router(console_routes.internal)
    add_console_page(api)
    return api
