"""A lean path for the most frequent request: a plain key read.

``GET /tables/{table}/keys/{key}``, with no query parameters but the consistency ones
(``consistent_with``, ``timeout_ms``, ``max_lag_records``, ``max_lag_ms``), on a table
that is not windowed, with the right bearer token (when one is set), is answered here by
the same :class:`~api.queries.Queries` the FastAPI route uses, without FastAPI's routing,
dependency injection and response classes: those cost more per read than the read.
Everything else (other routes, change streams, windowed reads, other query parameters,
values FastAPI would refuse, a missing or wrong token, a key FastAPI or
:func:`~api.queries.encode_key` would refuse) goes to the FastAPI app unchanged, which
answers it, errors included, exactly as before.
"""

from __future__ import annotations

import hmac
import time
from typing import Any
from urllib.parse import parse_qsl

import orjson

from api.errors import QueryError
from api.metrics import QUERY_LATENCY
from api.peers import FORWARDED_HEADER
from api.queries import MAX_KEY_BYTES, MAX_WAIT_MS, Answer, ReadOptions
from api.tokens import MAX_TOKEN_CHARS

#: The route template the FastAPI app reports for key reads (the latency metric's label).
KEY_ROUTE = "/tables/{table}/keys/{key:path}"
_PREFIX = "/tables/"
_KEYS = "/keys/"
_FORWARDED = FORWARDED_HEADER.lower().encode("latin-1")
_CHANGES = "/changes"
_OPTIONS = frozenset({"consistent_with", "timeout_ms", "max_lag_records", "max_lag_ms"})


class KeyReads:
    """Pure ASGI app in front of the FastAPI app ``api``."""

    def __init__(self, api: Any) -> None:
        self.api = api
        self._latency: dict[str, Any] = {}

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if (
            scope["type"] != "http"
            or scope["method"] != "GET"
            or not scope["path"].startswith(_PREFIX)
            or scope["path"].endswith(_CHANGES)
        ):
            await self.api(scope, receive, send)
            return
        started = time.perf_counter()
        answer = await self._answer(scope)
        if answer is None:
            await self.api(scope, receive, send)
            return
        status, body, headers = answer
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-length", str(len(body)).encode()),
                    (b"content-type", b"application/json"),
                    *headers,
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
        replica = next((v.decode() for k, v in headers if k == b"x-replica"), "none")
        self._observe(replica, time.perf_counter() - started)

    def _observe(self, replica: str, seconds: float) -> None:
        child = self._latency.get(replica)
        if child is None:
            child = self._latency[replica] = QUERY_LATENCY.labels(route=KEY_ROUTE, replica=replica)
        child.observe(seconds)

    async def _answer(
        self, scope: dict[str, Any]
    ) -> tuple[int, bytes, list[tuple[bytes, bytes]]] | None:
        """The response to a plain key read, or None to leave the request to FastAPI."""
        table_name, sep, key = scope["path"][len(_PREFIX) :].partition(_KEYS)
        if not sep or not table_name or "/" in table_name or not key or len(key) > MAX_KEY_BYTES:
            return None
        options = read_options(scope["query_string"])
        if options is None:
            return None
        state = self.api.state
        queries = state.queries
        table = queries.tables.get(table_name)
        if table is None or table.kind == "windowed":
            return None
        forwarded: str | None = None
        authorization: bytes | None = None
        for name, value in scope["headers"]:
            if name == b"authorization":
                authorization = value
            elif name == _FORWARDED:
                forwarded = value.decode("latin-1")
        if not _authorized(state.worker.settings.api_token, authorization):
            return None
        try:
            query = queries.query(table, key, None, None, None, options)
        except QueryError:
            return None
        try:
            answer: Answer = await queries.read(query, forwarded)
        except QueryError as error:
            headers = [(k.lower().encode(), v.encode()) for k, v in error.headers.items()]
            return error.status, orjson.dumps(error.body()), headers
        return (
            answer.status,
            orjson.dumps(answer.body),
            [
                (b"x-served-by", answer.served_by.encode()),
                (b"x-replica", answer.replica.encode()),
            ],
        )


def read_options(query_string: bytes) -> ReadOptions | None:
    """The consistency parameters of a query string, or None when it holds anything else
    (or a value the FastAPI route would refuse: FastAPI answers those)."""
    if not query_string:
        return ReadOptions()
    try:
        pairs = parse_qsl(query_string.decode("latin-1"), strict_parsing=True)
    except ValueError:
        return None
    found: dict[str, Any] = {}
    for name, value in pairs:
        if name in found or name not in _OPTIONS:
            return None
        if name == "consistent_with":
            if len(value) > MAX_TOKEN_CHARS:
                return None
            found[name] = value
            continue
        if not value.isascii() or not value.isdigit():
            return None
        number = int(value)
        if name == "timeout_ms" and number > MAX_WAIT_MS:
            return None
        found[name] = number
    return ReadOptions(**found)


def _authorized(expected: str | None, authorization: bytes | None) -> bool:
    """True when no token is set, or the header is ``Bearer <the token>``."""
    if not expected:
        return True
    if authorization is None:
        return False
    scheme, _, credentials = authorization.decode("latin-1").partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(credentials.encode(), expected.encode())
