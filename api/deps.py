"""Dependencies of the routes: the worker, its query services, the bearer token."""

from __future__ import annotations

import hmac
from typing import Annotated, Any

from fastapi import Depends, Path, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import AfterValidator

from api.changes import Changes
from api.errors import Unauthorized
from api.peers import FORWARDED_HEADER
from api.queries import Queries, key_within_limit
from api.routing import QueryTable
from api.scans import Scans
from api.schemas import ErrorDetail
from tables.membership import WorkerView


def get_worker(request: Request) -> WorkerView:
    worker: WorkerView = request.app.state.worker
    return worker


def get_queries(request: Request) -> Queries:
    queries: Queries = request.app.state.queries
    return queries


def get_scans(request: Request) -> Scans:
    scans: Scans = request.app.state.scans
    return scans


def get_changes(request: Request) -> Changes:
    changes: Changes = request.app.state.changes
    return changes


def get_table(table: str, queries: Annotated[Queries, Depends(get_queries)]) -> QueryTable:
    return queries.table(table)


def forwarded_by(request: Request) -> str | None:
    """The sender's URL when a peer forwarded this request (kept out of the OpenAPI)."""
    return request.headers.get(FORWARDED_HEADER)


_bearer = HTTPBearer(auto_error=False, description="STREAMSTATE_API_TOKEN, when it is set")


def require_token(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    """401 unless the request carries ``Authorization: Bearer <STREAMSTATE_API_TOKEN>``."""
    expected: str | None = request.app.state.worker.settings.api_token
    if not expected:
        return
    if credentials is None:
        given = request.headers.get("authorization", "").strip()
        if given:
            scheme = given.split(" ", 1)[0][:20]
            raise Unauthorized(
                f"the Authorization header's scheme is {scheme!r}: send "
                "'Authorization: Bearer <token>'"
            )
        raise Unauthorized("missing bearer token")
    if not hmac.compare_digest(credentials.credentials.encode(), expected.encode()):
        raise Unauthorized("invalid bearer token")


async def authorize(request: Request) -> None:
    """:func:`require_token` for checks that run before FastAPI reads the body."""
    require_token(request, await _bearer(request))


Worker = Annotated[WorkerView, Depends(get_worker)]
QueriesDep = Annotated[Queries, Depends(get_queries)]
ScansDep = Annotated[Scans, Depends(get_scans)]
ChangesDep = Annotated[Changes, Depends(get_changes)]
Table = Annotated[QueryTable, Depends(get_table)]
ForwardedBy = Annotated[str | None, Depends(forwarded_by)]
#: The answer every route behind the token documents.
UNAUTHORIZED: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorDetail, "description": "missing or wrong bearer token"}
}
#: A key in a route's path: 1 to 1,024 bytes of UTF-8 (else a 422 that says so).
KeyPath = Annotated[str, Path(min_length=1), AfterValidator(key_within_limit)]
