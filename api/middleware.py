"""Query latency, by route template and the replica that answered (``X-Replica``); HEAD
requests answered as their GET would be, without the body; paths whose percent-escapes
are not UTF-8 refused."""

from __future__ import annotations

import contextlib
import time
from typing import Any

import orjson

from api.metrics import QUERY_LATENCY
from api.paths import utf8_path

Scope = dict[str, Any]


class LatencyMiddleware:
    """Pure ASGI middleware: observes each HTTP request in ``QUERY_LATENCY``."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        replica = "none"

        async def observe(message: dict[str, Any]) -> None:
            nonlocal replica
            if message["type"] == "http.response.start":
                for name, value in message.get("headers", ()):
                    if name.lower() == b"x-replica":
                        replica = value.decode("latin-1")
            await send(message)

        try:
            await self.app(scope, receive, observe)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            QUERY_LATENCY.labels(route=template, replica=replica).observe(
                time.perf_counter() - started
            )


class _HeadDone(Exception):
    """The head of a HEAD request's answer is sent: the GET that makes it stops."""


class HeadMiddleware:
    """Pure ASGI middleware: a HEAD request runs as its GET (every GET route answers
    HEAD, as HTTP asks), and the answer's status and headers go out without its body.
    A streamed answer (a change stream) is stopped once its head is out."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return

        async def head_only(message: dict[str, Any]) -> None:
            if message["type"] != "http.response.body":
                await send(message)
                return
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            raise _HeadDone

        with contextlib.suppress(_HeadDone):
            await self.app({**scope, "method": "GET"}, receive, head_only)


class PathMiddleware:
    """Pure ASGI middleware: a path whose percent-escapes are not UTF-8 (``%FF``, or
    Latin-1 text escaped byte by byte) gets a 400 that says so, instead of reaching a
    route with U+FFFD in place of what was sent."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or utf8_path(scope):
            await self.app(scope, receive, send)
            return
        body = orjson.dumps(
            {"detail": "path: its percent-escapes are not UTF-8 (keys and names are UTF-8 text)"}
        )
        await send(
            {
                "type": "http.response.start",
                "status": 400,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
