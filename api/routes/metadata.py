"""/metadata: where every partition lives, and where a given key lives.

The group shares only active placements; each worker knows its own standbys, so they
are gathered from every member through ``/internal/assignment``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Depends

from api.deps import CHECKED_QUERY, KeyPath, QueriesDep, Table, known_query, require_token
from api.queries import Queries
from api.routes.tables import ERRORS
from api.schemas import GroupMetadata, HostAssignment, KeyMetadata

router = APIRouter(
    prefix="/metadata",
    tags=["metadata"],
    dependencies=[Depends(require_token), Depends(known_query)],
    responses=CHECKED_QUERY,
)


async def gather_hosts(queries: Queries) -> list[HostAssignment]:
    """Every member with its actives (the group's view) and standbys (its own report)."""
    routing = queries.routing
    actives = routing.actives_by_host()
    peers = routing.peers()
    answers = await asyncio.gather(
        *(queries.peers.get(url, "/internal/assignment", {}, purpose="metadata") for url in peers)
    )
    standbys: dict[str, dict[str, list[int]] | None] = {}
    for url, answer in zip(peers, answers, strict=True):
        ok = answer is not None and answer.status == 200 and isinstance(answer.body, dict)
        standbys[url] = answer.body.get("standby", {}) if ok and answer else None
    _, own_standby = routing.own_assignment()
    standbys[routing.own_url] = own_standby
    return [
        HostAssignment(
            url=url,
            active=actives.get(url, {}),
            standby=standbys.get(url) or {},
            reachable=standbys.get(url) is not None,
        )
        for url in routing.members()
    ]


@router.get("", response_model=GroupMetadata)
async def group_metadata(queries: QueriesDep) -> GroupMetadata:
    """Active and standby changelog partitions of every worker of the group."""
    return GroupMetadata(hosts=await gather_hosts(queries))


@router.get("/tables/{table}/keys/{key:path}", response_model=KeyMetadata, responses=ERRORS)
async def key_metadata(
    table: Table,
    queries: QueriesDep,
    key: KeyPath,
) -> Any:
    """The partition of a key and the workers holding it, like Kafka Streams'
    ``queryMetadataForKey``. For a global table every worker answers:
    ``active`` is null and ``standbys`` empty."""
    query = queries.query(table, key, None, None, None)
    if table.kind == "global":
        return KeyMetadata(
            table=table.name, key=key, partition=query.partition, active=None, standbys=[]
        )
    hosts = await gather_hosts(queries)
    standbys = [h.url for h in hosts if query.partition in h.standby.get(table.topic, [])]
    return KeyMetadata(
        table=table.name,
        key=key,
        partition=query.partition,
        active=queries.routing.owner(table, query.partition),
        standbys=standbys,
    )
