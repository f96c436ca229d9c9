"""Liveness and readiness."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from api.deps import Worker
from api.readiness import readiness
from api.schemas import Readiness

router = APIRouter(tags=["health"])


@router.get("/health")
async def health() -> dict[str, str]:
    """200 while the process runs."""
    return {"status": "ok"}


@router.get(
    "/ready",
    response_model=Readiness,
    responses={
        503: {
            "model": Readiness,
            "description": "recovering, not yet assigned, no broker, failed (a store "
            "failed: the worker processes nothing until it is restarted), or stalled (a "
            "partition has not advanced for 10 s: its cycle keeps failing)",
        }
    },
)
async def ready(worker: Worker) -> JSONResponse:
    """200 once the worker holds an assignment and its active partitions are recovered;
    else 503 with each active partition's restore progress. ``stalled`` lists the
    partitions whose cycle failed, waits on Kafka or has been applying its records for
    10 s (reason, input offsets, attempts); one that failed or waits for
    :data:`~api.readiness.STALLED_NOT_READY_S` or more makes the answer 503 ``stalled``."""
    status, body, headers = readiness(worker)
    return JSONResponse(body, status_code=status, headers=headers or None)
