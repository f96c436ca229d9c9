"""Serve the worker's API (api/front.py, then the FastAPI app) with uvicorn on the
worker's own event loop.

The server is a child service of the faust app that starts with the app, before
table recovery, so that ``/health`` and ``/ready`` answer during a long restore
(faust's own ``serve_asgi`` opens the port only after recovery).
"""

from __future__ import annotations

import socket
from typing import Any

from faust.contrib.asgi import AsgiService, maybe_instrument_opentelemetry

from api.fastpath import KeyReadProtocol, KeyReads


class ApiServer(AsgiService):
    """uvicorn inside the worker, bound to the worker's canonical host and port.

    Plain key reads take the lean path of :class:`~api.fastpath.KeyReadProtocol`; every
    other request reaches the FastAPI app. Given ``sock``, a socket already listening on that
    address, it serves there instead of binding the address itself.
    """

    driver_version = "FastAPI/uvicorn"

    def __init__(
        self,
        asgi_app: Any,
        *,
        host: str,
        port: int,
        sock: socket.socket | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            KeyReads(asgi_app),
            host=host,
            port=port,
            uvicorn_options={
                "access_log": False,
                "timeout_keep_alive": 30,
                "http": KeyReadProtocol,
            },
            **kwargs,
        )
        self._sock = sock

    async def on_start(self) -> None:
        if self._sock is None:
            await super().on_start()
            return
        maybe_instrument_opentelemetry(self.asgi_app, self.opentelemetry)
        self._server = self._create_server()
        self._serve_fut = self.add_future(self._server.serve(sockets=[self._sock]))
