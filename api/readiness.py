"""Readiness: what ``/ready`` answers, apart from the web framework that serves it.

The same answer comes from the FastAPI route (api/routes/health.py) and from the
worker's front app while FastAPI is still being imported (api/front.py).
"""

from __future__ import annotations

from typing import Any

from tables.membership import WorkerView

#: A partition that has not advanced this long makes /ready answer 503 ``stalled``
#: (a shorter stall, a failed attempt that the next one mends, is listed only).
STALLED_NOT_READY_S = 10.0

#: status, JSON body, extra headers
ReadyAnswer = tuple[int, dict[str, Any], dict[str, str]]


def readiness(worker: WorkerView) -> ReadyAnswer:
    """200 once the worker holds an assignment and its active partitions are recovered;
    else 503 with each active partition's restore progress. ``stalled`` lists the
    partitions whose cycle failed, waits on Kafka or has been applying its records for
    10 s (reason, input offsets, attempts); one that failed or waits for
    :data:`STALLED_NOT_READY_S` or more makes the answer 503 ``stalled``."""
    membership = worker.membership
    found = membership.assignment()
    assignment = found.actives if found is not None else frozenset()
    progress = membership.restore_progress()
    engine = worker.engine
    stalled = engine.stalled()
    failure = engine.failure
    if failure is not None:
        body = {
            "status": "failed",
            "assigned": len(assignment),
            "detail": f"{failure}; restart the worker once the cause is mended",
            "stalled": stalled,
        }
        return 503, body, {}
    # Read from the consumer's own connections, not from new probe connections: on
    # loopback a probe of a stopped broker's port can connect the socket to itself (TCP
    # self-connect) and keep the broker from binding its port again.
    if membership.broker_connected() is False:
        body = {
            "status": "broker-unreachable",
            "assigned": len(assignment),
            "detail": "no live connection to any Kafka broker of "
            + worker.settings.bootstrap_servers,
            "stalled": stalled,
        }
        return 503, body, {"Retry-After": "2"}
    if membership.rebalancing or not assignment or progress["remaining_total"]:
        body = {
            "status": "recovering",
            "assigned": len(assignment),
            "progress": progress,
            "stalled": stalled,
        }
        return 503, body, {"Retry-After": "1"}
    # A cycle still applying its records (Busy) advances, however slowly: listed only.
    stuck = [s for s in stalled if s["stalled_s"] >= STALLED_NOT_READY_S and s["error"] != "Busy"]
    if stuck:
        first = stuck[0]
        body = {
            "status": "stalled",
            "assigned": len(assignment),
            "progress": progress,
            "detail": f"partition {first['partition']} has not advanced for "
            f"{first['stalled_s']:.0f} s, stuck at {first['inputs']}: {first['reason']}",
            "stalled": stalled,
        }
        return 503, body, {"Retry-After": str(max(1, round(first["retry_in_s"])))}
    body = {
        "status": "ready",
        "assigned": len(assignment),
        "progress": progress,
        "stalled": stalled,
    }
    return 200, body, {}
