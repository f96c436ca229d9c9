"""/metrics in the Prometheus text format."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from api.metrics import REGISTRY

router = APIRouter(tags=["metrics"])


@router.get("/metrics", response_class=Response)
async def metrics(request: Request) -> Response:
    """Counters, histograms and gauges of this worker."""
    text = generate_latest(REGISTRY) + generate_latest(request.app.state.worker_registry)
    return Response(text, media_type=CONTENT_TYPE_LATEST)
