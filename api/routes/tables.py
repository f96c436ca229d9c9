"""/tables: the table list, key reads and key scans."""

from __future__ import annotations

from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Depends, Path, Query
from fastapi.responses import Response

from api.deps import ForwardedBy, QueriesDep, ScansDep, Table, require_token
from api.queries import MAX_KEY_BYTES, Answer
from api.schemas import ErrorDetail, KeyValue, KeyWindows, ScanPage, TableDescription, TableList

router = APIRouter(prefix="/tables", tags=["tables"], dependencies=[Depends(require_token)])

#: Epoch milliseconds up to the year 9999.
MAX_MS = 253_402_300_799_999
EpochMs = Annotated[int | None, Query(ge=0, le=MAX_MS, description="epoch milliseconds")]

ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorDetail, "description": "invalid key or parameters"},
    401: {"model": ErrorDetail, "description": "missing or wrong bearer token"},
    404: {"model": ErrorDetail, "description": "unknown table, or absent key"},
    503: {"model": ErrorDetail, "description": "no copy of the partition can answer now"},
}


def json_answer(answer: Answer) -> Response:
    headers = {"X-Served-By": answer.served_by, "X-Replica": answer.replica}
    return Response(
        orjson.dumps(answer.body),
        status_code=answer.status,
        media_type="application/json",
        headers=headers,
    )


@router.get("", response_model=TableList)
async def list_tables(queries: QueriesDep) -> TableList:
    """Every queryable table."""
    return TableList(
        tables=[
            TableDescription(
                name=t.name,
                kind=t.kind,
                partitions=t.partitions,
                changelog_topic=t.topic,
                standby_replicas=t.standby_replicas,
            )
            for t in queries.tables.values()
        ]
    )


@router.get(
    "/{table}/keys",
    response_model=ScanPage,
    responses={k: v for k, v in ERRORS.items() if k != 503},
)
async def scan_keys(
    table: Table,
    scans: ScansDep,
    prefix: Annotated[str, Query(max_length=MAX_KEY_BYTES)] = "",
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    cursor: Annotated[str | None, Query(max_length=4096)] = None,
) -> Any:
    """Keys in ascending order, gathered from every partition's owner (or a standby).

    For a windowed table each item's value is the list of the key's retained windows.
    """
    return await scans.scan(table, prefix, cursor, limit)


@router.get(
    "/{table}/keys/{key:path}",
    response_model=KeyValue | KeyWindows,
    responses=ERRORS,
)
async def read_key(
    table: Table,
    queries: QueriesDep,
    forwarded: ForwardedBy,
    key: Annotated[str, Path(min_length=1, max_length=MAX_KEY_BYTES)],
    at: EpochMs = None,
    start: Annotated[
        int | None, Query(alias="from", ge=0, le=MAX_MS, description="epoch milliseconds")
    ] = None,
    end: Annotated[
        int | None, Query(alias="to", ge=0, le=MAX_MS, description="epoch milliseconds")
    ] = None,
) -> Response:
    """The value of a key, from the active copy of its partition (or a standby's).

    Windowed tables answer the window holding `at` (default: now), or with `from` and
    `to` every window that overlaps that interval.
    """
    query = queries.query(table, key, at, start, end)
    return json_answer(await queries.read(query, forwarded))
