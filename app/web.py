"""The worker's web server: the HTTP API, imported off the event loop, and the stand-in
that keeps faust's own web stack from starting.

FastAPI, pydantic's models of the routes and the HTTP client for forwarded reads take
about a third of the CPU a worker spends importing its modules. Imported at start, that
time would come before the worker joins its group; imported in a thread once the worker
runs, it overlaps with the join and the restore, which mostly wait for the brokers. The
port is taken at the process's start (app/listen.py), and answered "starting" until the
API takes it over.
"""

from __future__ import annotations

import asyncio
import gc
import importlib
import socket
from typing import Any

from mode import Service

from app import listen
from tables.membership import WorkerView


class LegacyWebDisabled(Service):
    """Registered as faust's web server so that faust never starts its aiohttp stack.

    ``faust worker`` turns the web server on by default and would take the port that the
    API serves; registering any service through ``App.web_server`` replaces faust's
    stack, and this one does nothing.
    """


class DeferredApi(Service):
    """Starts the HTTP API (``app.server.ApiServer`` over ``api.create_api``) as a child
    service once its modules have been imported in a thread."""

    def __init__(
        self,
        worker: WorkerView,
        *,
        host: str,
        port: int,
        sock: socket.socket | None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.worker = worker
        self.host = host
        self.port = port
        self.sock = sock
        #: set once the API's server has started
        self.serving = asyncio.Event()

    async def on_start(self) -> None:
        self.add_future(self._serve())

    async def _serve(self) -> None:
        await asyncio.to_thread(importlib.import_module, "app.server")
        # What the import allocated lives as long as the worker, like the rest of the
        # start-up: out of the collector's way (app.main froze the rest).
        gc.freeze()
        from api import create_api
        from app.server import ApiServer

        api = create_api(self.worker)
        if self.sock is not None:
            listen.hand_over(self.sock)
        server = ApiServer(
            api,
            host=self.host,
            port=self.port,
            sock=self.sock,
            loop=self.loop,
            beacon=self.beacon,
        )
        await self.add_runtime_dependency(server)
        self.serving.set()

    @property
    def label(self) -> str:
        return f"{type(self).__name__}: http://{self.host}:{self.port}"
