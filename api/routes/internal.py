"""/internal: what workers ask each other (not part of the public contract).

Every route answers from this worker's own state only and never calls a peer.
"""

from __future__ import annotations

from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Depends, Query
from fastapi.responses import Response

from api.deps import ForwardedBy, QueriesDep, ScansDep, Table, require_token
from api.errors import BadRequest
from api.peers import BATCH_KEYS
from api.queries import MAX_KEY_BYTES
from api.schemas import HostAssignment, LocalScan

router = APIRouter(
    prefix="/internal",
    tags=["internal"],
    dependencies=[Depends(require_token)],
    include_in_schema=False,
)


@router.get("/assignment", response_model=HostAssignment)
async def own_assignment(queries: QueriesDep) -> HostAssignment:
    """This worker's active and standby changelog partitions."""
    active, standby = queries.routing.own_assignment()
    return HostAssignment(url=queries.routing.own_url, active=active, standby=standby)


def parse_partitions(text: str, count: int) -> list[int]:
    try:
        partitions = sorted({int(p) for p in text.split(",") if p.strip()})
    except ValueError:
        raise BadRequest("partitions: comma-separated partition numbers") from None
    if any(p < 0 or p >= count for p in partitions):
        raise BadRequest(f"partitions: must lie in [0, {count})")
    return partitions


@router.get("/tables/{table}/scan", response_model=LocalScan)
async def scan_own_partitions(
    table: Table,
    scans: ScansDep,
    partitions: Annotated[str, Query(max_length=4096)],
    prefix: Annotated[str, Query(max_length=MAX_KEY_BYTES)] = "",
    after: Annotated[str | None, Query(max_length=MAX_KEY_BYTES)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> Any:
    """Keys of the listed partitions that this worker holds a copy of."""
    wanted = parse_partitions(partitions, table.partitions)
    pages = scans.local_pages(table, wanted, prefix, after, limit)
    return {"partitions": [page.as_dict() for page in pages]}


@router.get("/reads/{table}")
async def read_many(
    table: Table,
    queries: QueriesDep,
    forwarded: ForwardedBy,
    key: Annotated[list[str], Query(min_length=1, max_length=BATCH_KEYS)],
) -> Response:
    """Plain reads of several keys, each answered as a forwarded key read (from this
    worker's own copy): ``{"answers": [[status, body], ...]}`` in the keys' order."""
    if table.kind != "table":
        raise BadRequest(f"{table.name} is a {table.kind} table: batches read plain tables")
    found = await queries.read_many(table, key, forwarded or "peer")
    return Response(orjson.dumps({"answers": found}), media_type="application/json")
