"""Build the FastAPI application of a worker."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse

from api.routes import health


def create_api(worker: Any) -> FastAPI:
    """Create the HTTP API of one worker.

    ``worker`` is the faust app; routes reach it through ``request.app.state.worker``.
    """
    api = FastAPI(
        title="streamstate",
        summary="Interactive queries over the stream processor's tables",
        version="0.1.0",
        default_response_class=JSONResponse,
    )
    api.state.worker = worker
    api.include_router(health.router)
    return api
