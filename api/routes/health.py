"""Liveness and readiness."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

router = APIRouter(tags=["health"])


@router.get("/health")
async def health() -> dict[str, str]:
    """200 while the process runs."""
    return {"status": "ok"}


@router.get("/ready", responses={503: {"description": "recovering or not yet assigned"}})
async def ready(request: Request) -> JSONResponse:
    """200 once the worker holds an assignment and its active partitions are recovered."""
    worker: Any = request.app.state.worker
    assignment = worker.assignor.assigned_actives() if worker.assignor else set()
    recovery = worker.tables.recovery
    remaining = {str(tp): n for tp, n in recovery.active_remaining().items() if n > 0}
    if worker.rebalancing or not assignment or remaining:
        progress = {"remaining": remaining, "assigned": len(assignment)}
        return JSONResponse(
            {"status": "recovering", "progress": progress},
            status_code=503,
            headers={"Retry-After": "1"},
        )
    return JSONResponse({"status": "ready", "assigned": len(assignment)})
