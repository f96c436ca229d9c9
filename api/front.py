"""The worker's front ASGI app: serves while the FastAPI app is still being imported.

FastAPI, starlette and pydantic's models of the routes cost a restarted worker about
half a second of CPU, which it would otherwise spend before it can answer ``/ready``.
The front app needs none of them: plain key reads are answered before they reach it
(api/fastpath.py), ``/health`` and ``/ready`` it answers itself from the same
:func:`~api.readiness.readiness` the FastAPI route gives, and every other request waits
for the FastAPI app (:meth:`FrontApp.attach`) for up to :data:`WAIT_FOR_API_S`, then is
answered 503 with ``Retry-After``. Once attached, every request goes to FastAPI.

It also runs the :class:`~api.core.ApiCore`'s start and stop, from the server's
lifespan.
"""

from __future__ import annotations

import asyncio
import contextlib
from types import SimpleNamespace
from typing import Any

import orjson

from api.core import ApiCore
from api.readiness import readiness

#: How long a request for a route of the FastAPI app waits for that app to be attached.
WAIT_FOR_API_S = 10.0

Scope = dict[str, Any]


class FrontApp:
    """ASGI app over ``core``; :meth:`attach` hands every request to the full app."""

    def __init__(self, core: ApiCore, wait_s: float = WAIT_FOR_API_S) -> None:
        self.core = core
        self.wait_s = wait_s
        #: what :class:`~api.fastpath.KeyReads` reads of the app it stands in front of
        self.state = SimpleNamespace(queries=core.queries, worker=core.worker)
        self.full: Any = None
        self._attached = asyncio.Event()

    def attach(self, app: Any) -> None:
        """Every request from now on goes to ``app`` (built over the same core)."""
        self.full = app
        self._attached.set()

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if self.full is not None:
            await self.full(scope, receive, send)
            return
        if scope["type"] == "http":
            path = scope["path"]
            if path == "/health":
                await _send_json(send, 200, {"status": "ok"}, {})
                return
            if path == "/ready":
                status, body, headers = readiness(self.core.worker)
                await _send_json(send, status, body, headers)
                return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._attached.wait(), self.wait_s)
        if self.full is not None:
            await self.full(scope, receive, send)
        elif scope["type"] == "http":
            detail = "the worker's HTTP API is starting; retry"
            await _send_json(send, 503, {"detail": detail}, {"Retry-After": "1"})
        # a websocket scope is closed unanswered: the server refuses it

    async def _lifespan(self, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await self.core.start()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.core.stop()
                await send({"type": "lifespan.shutdown.complete"})
                return


async def _send_json(send: Any, status: int, body: Any, headers: dict[str, str]) -> None:
    content = orjson.dumps(body)
    raw = [
        (b"content-length", str(len(content)).encode()),
        (b"content-type", b"application/json"),
    ]
    raw += [(name.lower().encode(), value.encode()) for name, value in headers.items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": content})
