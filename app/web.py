"""The worker's web server: the HTTP API, imported off the event loop in two steps, and
the stand-in that keeps faust's own web stack from starting.

The port is taken at the process's start (app/listen.py), and answered "starting" until
the API takes it over. The API's modules are imported in a thread, so that the import
overlaps with the join and the restore, which mostly wait for the brokers, in two steps:
first the lean part (uvicorn, the key-read path, the query layer: api/front.py), which
serves key reads, ``/health`` and ``/ready`` as soon as it is imported; then FastAPI and
the models of its routes, about half a second of CPU, once the worker is ready (or
:data:`FULL_API_AFTER_S` after the lean part serves, if it is not ready by then), so
that a restarted worker does not spend that CPU before it can say it is ready.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import importlib
import socket
from collections.abc import Awaitable, Callable
from typing import Any

from mode import Service

from app import listen
from tables.membership import WorkerView

#: How long after the lean part of the API serves the FastAPI app is imported, if the
#: worker is not ready before.
FULL_API_AFTER_S = 2.0


class LegacyWebDisabled(Service):
    """Registered as faust's web server so that faust never starts its aiohttp stack.

    ``faust worker`` turns the web server on by default and would take the port that the
    API serves; registering any service through ``App.web_server`` replaces faust's
    stack, and this one does nothing.
    """


class DeferredApi(Service):
    """Starts the HTTP API (``app.server.ApiServer`` over ``api.front.FrontApp``) as a
    child service once its lean modules have been imported in a thread, and hands the
    front app the FastAPI app (``api.create_api``) once the worker is ready."""

    def __init__(
        self,
        worker: WorkerView,
        *,
        host: str,
        port: int,
        sock: socket.socket | None,
        full_api_after: Callable[[], Awaitable[Any]] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.worker = worker
        self.host = host
        self.port = port
        self.sock = sock
        #: what the FastAPI app's import waits for, at most FULL_API_AFTER_S (the
        #: composition root: the worker's first recovery completed)
        self.full_api_after = full_api_after
        #: set once the API's server has started (key reads, /health and /ready)
        self.serving = asyncio.Event()

    async def on_start(self) -> None:
        self.add_future(self._serve())

    async def _serve(self) -> None:
        for module in ("app.server", "api.front"):
            await asyncio.to_thread(importlib.import_module, module)
        # What the import allocated lives as long as the worker, like the rest of the
        # start-up: out of the collector's way (app.main froze the rest).
        gc.freeze()
        from api.core import ApiCore
        from api.front import FrontApp
        from app.server import ApiServer

        core = ApiCore(self.worker)
        front = FrontApp(core)
        if self.sock is not None:
            listen.hand_over(self.sock)
        server = ApiServer(
            front,
            host=self.host,
            port=self.port,
            sock=self.sock,
            loop=self.loop,
            beacon=self.beacon,
        )
        await self.add_runtime_dependency(server)
        self.serving.set()
        if self.full_api_after is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.full_api_after(), FULL_API_AFTER_S)
        await asyncio.to_thread(importlib.import_module, "api.app")
        gc.freeze()
        from api.app import create_api

        front.attach(create_api(self.worker, core))

    @property
    def label(self) -> str:
        return f"{type(self).__name__}: http://{self.host}:{self.port}"
