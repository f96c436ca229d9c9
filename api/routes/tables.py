"""/tables: the table list, key reads and key scans."""

from __future__ import annotations

from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Depends, Header, Query
from fastapi.responses import Response, StreamingResponse
from fastapi.routing import APIRoute
from starlette.routing import Match
from starlette.types import Scope

from api.deps import (
    CHECKED_QUERY,
    ChangesDep,
    ForwardedBy,
    KeyPath,
    QueriesDep,
    ScansDep,
    Table,
    known_query,
    require_token,
)
from api.paths import names_changes, raw_path
from api.queries import DEFAULT_WAIT_MS, MAX_KEY_BYTES, MAX_WAIT_MS, Answer, ReadOptions
from api.schemas import (
    ErrorDetail,
    KeyValue,
    KeyWindows,
    NotYetDetail,
    ScanPage,
    StaleDetail,
    TableDescription,
    TableList,
)
from api.tokens import MAX_TOKEN_CHARS

router = APIRouter(
    prefix="/tables",
    tags=["tables"],
    dependencies=[Depends(require_token), Depends(known_query)],
    responses=CHECKED_QUERY,
)

#: Epoch milliseconds up to the year 9999.
MAX_MS = 253_402_300_799_999
EpochMs = Annotated[int | None, Query(ge=0, le=MAX_MS, description="epoch milliseconds")]

ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorDetail, "description": "invalid key, parameters or token"},
    401: {"model": ErrorDetail, "description": "missing or wrong bearer token"},
    404: {"model": ErrorDetail, "description": "unknown table, or absent key"},
    503: {
        "model": StaleDetail,
        "description": "no copy of the partition can answer now, or none within the "
        "staleness bound (with Retry-After)",
    },
}
READ_ERRORS: dict[int | str, dict[str, Any]] = {
    **ERRORS,
    504: {
        "model": NotYetDetail,
        "description": "no copy reached the token's position within timeout_ms",
    },
}

Token = Annotated[
    str | None,
    Query(
        max_length=MAX_TOKEN_CHARS,
        description="A token from POST /topics/{topic}/records: answer only from a copy "
        "that holds that write (read your writes), waiting up to timeout_ms.",
    ),
]
TimeoutMs = Annotated[
    int | None,
    Query(ge=0, le=MAX_WAIT_MS, description=f"ms to wait (default {DEFAULT_WAIT_MS})"),
]
MaxLagRecords = Annotated[
    int | None,
    Query(
        ge=0,
        description="answer only from a copy at most this many input records behind "
        "(as of the inputs' end offsets, read every 0.5 s)",
    ),
]
MaxLagMs = Annotated[
    int | None,
    Query(
        ge=0,
        description="answer only from a copy whose oldest unapplied input record "
        "is at most this old, in ms",
    ),
]


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
                window=None if t.window is None else t.window.describe(),
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


class ChangesRoute(APIRoute):
    """The change stream's route, taken only when the path as sent ends with a ``changes``
    segment: ``x%2Fchanges`` is the key ``x/changes``, which the key read answers, though
    its decoded path (``x/changes``) fits this route's pattern too."""

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        if scope["type"] == "http" and not names_changes(raw_path(scope)):
            return Match.NONE, {}
        return super().matches(scope)


async def key_changes(
    table: Table,
    queries: QueriesDep,
    changes: ChangesDep,
    forwarded: ForwardedBy,
    key: KeyPath,
    last_event_id: Annotated[str | None, Header(max_length=256)] = None,
) -> StreamingResponse:
    """A stream of the key's values, from the active owner of its partition (a global
    table's from this worker's own copy).

    The last segment, `changes`, is the route's own: a key that ends with `/changes` sits
    in the path with that `/` escaped (`x%2Fchanges/changes` is the stream of the key
    `x/changes`, `x%2Fchanges` its value).
    """
    query = queries.query(table, key, None, None, None)
    stream = await changes.open(query, forwarded, last_event_id)
    return StreamingResponse(
        stream,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


router.add_api_route(
    "/{table}/keys/{key:path}/changes",
    key_changes,
    methods=["GET"],
    response_class=StreamingResponse,
    responses={
        200: {
            "content": {"text/event-stream": {}},
            "description": "Server-sent events: first the key's current value (`event: "
            "change`, or `event: absent`), then one `event: change` per new value with "
            '`data: {"value", "position"}` (and `"window"` for a windowed table) and an '
            "`id` to resume from with `Last-Event-ID`; `event: moved` ends the stream on "
            "a rebalance; comment lines every 15 s keep it open.",
        },
        **{k: v for k, v in ERRORS.items() if k != 404},
        404: {"model": ErrorDetail, "description": "unknown table"},
    },
    route_class_override=ChangesRoute,
)


@router.get(
    "/{table}/keys/{key:path}",
    response_model=KeyValue | KeyWindows,
    responses=READ_ERRORS,
)
async def read_key(
    table: Table,
    queries: QueriesDep,
    forwarded: ForwardedBy,
    key: KeyPath,
    at: EpochMs = None,
    start: Annotated[
        int | None, Query(alias="from", ge=0, le=MAX_MS, description="epoch milliseconds")
    ] = None,
    end: Annotated[
        int | None, Query(alias="to", ge=0, le=MAX_MS, description="epoch milliseconds")
    ] = None,
    consistent_with: Token = None,
    timeout_ms: TimeoutMs = None,
    max_lag_records: MaxLagRecords = None,
    max_lag_ms: MaxLagMs = None,
) -> Response:
    """The value of a key, from the active copy of its partition (or a standby's), with
    the position of the copy that answered.

    Windowed tables answer the window holding `at` (default: now), or with `from` and
    `to` every window that overlaps that interval. `consistent_with` reads your writes;
    `max_lag_records` and `max_lag_ms` bound the staleness of the answer.
    """
    options = ReadOptions(consistent_with, timeout_ms, max_lag_records, max_lag_ms)
    query = queries.query(table, key, at, start, end, options)
    return json_answer(await queries.read(query, forwarded))
