"""Query latency, by route template and the replica that answered (``X-Replica``)."""

from __future__ import annotations

import time
from typing import Any

from api.metrics import QUERY_LATENCY

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
