"""Serve the FastAPI app with uvicorn on the worker's own event loop.

The server is a child service of the faust app that starts with the app, before
table recovery, so that ``/health`` and ``/ready`` answer during a long restore
(faust's own ``serve_asgi`` opens the port only after recovery).
"""

from __future__ import annotations

from typing import Any

from faust.contrib.asgi import AsgiService
from mode import Service

from api.fastpath import KeyReads


class ApiServer(AsgiService):
    """uvicorn inside the worker, bound to the worker's canonical host and port.

    Plain key reads take the lean path of :class:`~api.fastpath.KeyReads`; every other
    request reaches the FastAPI app.
    """

    driver_version = "FastAPI/uvicorn"

    def __init__(self, asgi_app: Any, *, host: str, port: int, **kwargs: Any) -> None:
        super().__init__(
            KeyReads(asgi_app),
            host=host,
            port=port,
            uvicorn_options={"access_log": False, "timeout_keep_alive": 30},
            **kwargs,
        )


class LegacyWebDisabled(Service):
    """Registered as faust's web server so that faust never starts its aiohttp stack.

    ``faust worker`` turns the web server on by default and would take the port that
    :class:`ApiServer` serves; registering any service through ``App.web_server``
    replaces faust's stack, and this one does nothing.
    """
