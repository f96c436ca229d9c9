"""Liveness and readiness."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from api.broker import consumer_connected
from api.deps import Worker
from api.schemas import Readiness
from tables.faust_adapter import recovery_progress

router = APIRouter(tags=["health"])


@router.get("/health")
async def health() -> dict[str, str]:
    """200 while the process runs."""
    return {"status": "ok"}


def restore_progress(worker: Any) -> dict[str, Any]:
    """Per active changelog partition: the offset restored so far and the target."""
    return recovery_progress(worker)


@router.get(
    "/ready",
    response_model=Readiness,
    responses={
        503: {
            "model": Readiness,
            "description": "recovering, not yet assigned, no broker, or failed (a store "
            "failed: the worker processes nothing until it is restarted)",
        }
    },
)
async def ready(worker: Worker) -> JSONResponse:
    """200 once the worker holds an assignment and its active partitions are recovered;
    else 503 with each active partition's restore progress."""
    try:
        assignment = worker.assignor.assigned_actives()
    except Exception:  # no assignment before the first rebalance
        assignment = set()
    progress = restore_progress(worker)
    failure = worker.wiring.engine.failure
    if failure is not None:
        return JSONResponse(
            {
                "status": "failed",
                "assigned": len(assignment),
                "detail": f"{failure}; restart the worker once the cause is mended",
            },
            status_code=503,
        )
    if consumer_connected(worker) is False:
        return JSONResponse(
            {
                "status": "broker-unreachable",
                "assigned": len(assignment),
                "detail": "no live connection to any Kafka broker of "
                + worker.settings.bootstrap_servers,
            },
            status_code=503,
            headers={"Retry-After": "2"},
        )
    if worker.rebalancing or not assignment or progress["remaining_total"]:
        return JSONResponse(
            {"status": "recovering", "assigned": len(assignment), "progress": progress},
            status_code=503,
            headers={"Retry-After": "1"},
        )
    return JSONResponse({"status": "ready", "assigned": len(assignment), "progress": progress})
