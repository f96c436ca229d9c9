"""Dependencies of the routes: the worker, its query services, the bearer token."""

from __future__ import annotations

import hmac
from typing import Annotated, Any

from fastapi import Depends, Path, Request
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import AfterValidator

from api.changes import Changes
from api.errors import BadRequest, Unauthorized
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


#: id of a route -> the route and :func:`_query_names` of it
_QUERY_NAMES: dict[int, tuple[APIRoute, frozenset[str]]] = {}


def _query_names(route: APIRoute) -> frozenset[str]:
    """The query parameters a route takes, its dependencies' included. Kept with the
    route itself: an id names one object only while it lives, and a route of an app
    dropped since (tests make many) could hand its id on."""
    found = _QUERY_NAMES.get(id(route))
    if found is None or found[0] is not route:
        found = _QUERY_NAMES[id(route)] = (route, _walk_query_names(route))
    return found[1]


def _walk_query_names(route: APIRoute) -> frozenset[str]:
    names: set[str] = set()
    pending = [route.dependant]
    while pending:
        dependant = pending.pop()
        names.update(param.alias for param in dependant.query_params)
        pending.extend(dependant.dependencies)
    return frozenset(names)


async def known_query(request: Request) -> None:
    """400 for a query parameter the route does not take: a misspelt ``max_lag_record``
    would otherwise read with no staleness bound at all, without a word. A peer's
    forwarded request is let through (a newer peer may send more)."""
    route = request.scope.get("route")
    if not isinstance(route, APIRoute) or FORWARDED_HEADER in request.headers:
        return
    known = _query_names(route)
    unknown = sorted({name for name in request.query_params if name not in known})
    if unknown:
        names = ", ".join(repr(name[:40]) for name in unknown[:5])
        takes = ", ".join(sorted(known)) or "none"
        raise BadRequest(f"unknown query parameter {names}; this route takes: {takes}")


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
#: ... and every route that refuses query parameters it does not take (:func:`known_query`).
CHECKED_QUERY: dict[int | str, dict[str, Any]] = {
    **UNAUTHORIZED,
    400: {"model": ErrorDetail, "description": "a query parameter the route does not take"},
}
#: A key in a route's path: 1 to 1,024 bytes of UTF-8 (else a 422 that says so).
KeyPath = Annotated[str, Path(min_length=1), AfterValidator(key_within_limit)]
