"""The HTTP/1.1 client of the reads a worker forwards to its peers: plain GETs over pooled
keep-alive connections, responses parsed by httptools (the parser uvicorn serves with).

A forwarded key read is the most frequent request a worker sends, and a general client
costs more per request than the read it forwards: aiohttp builds a URL object, a header
multidict, a request and a response object, a timer and a connection-pool lease for every
GET. Here a request is one ``bytes`` written on an idle connection of the peer and one
future resolved when httptools has parsed the response: status and body, no headers
(nothing a caller reads).

One request at a time per connection (no pipelining); at most ``limit`` connections per
peer, requests beyond wait for one. A connection the peer closed while it was idle fails
its next request before any byte of the answer arrives; that request is sent once more
on a new connection (a GET may be repeated). Idle connections are not reused after
``idle_s``, well within the peer's keep-alive timeout, so the peer rarely closes one
under a request.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from urllib.parse import urlsplit

import httptools


class PeerHTTPError(ConnectionError):
    """The peer could not be reached, closed the connection, or answered what is not HTTP."""


class _Stale(PeerHTTPError):
    """The connection was closed before any byte of the answer came (may be sent again)."""


class _Connection(asyncio.Protocol):
    """One keep-alive connection to a peer, one request at a time."""

    def __init__(self, peer: _Peer) -> None:
        self.peer = peer
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.waiter: asyncio.Future[tuple[int, bytes]] | None = None
        self.parts: list[bytes] = []
        self.received = False
        self.closed = False
        self.reusable = True
        self.idle_since = 0.0

    # -- asyncio ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.received = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as error:
            self._fail(PeerHTTPError(f"{self.peer.base} answered what is not HTTP: {error}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.peer.forget(self)
        kind = PeerHTTPError if self.received else _Stale
        self._fail(kind(f"{self.peer.base} closed the connection" + (f": {exc}" if exc else "")))

    # -- httptools ----------------------------------------------------------------------

    def on_body(self, body: bytes) -> None:
        self.parts.append(body)

    def on_message_complete(self) -> None:
        status = self.parser.get_status_code()
        self.reusable = self.parser.should_keep_alive()
        body = b"".join(self.parts)
        self.parts = []
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result((status, body))

    # -- the client -----------------------------------------------------------------------

    def send(self, request: bytes) -> asyncio.Future[tuple[int, bytes]]:
        assert self.transport is not None
        assert self.waiter is None
        self.received = False
        self.waiter = self.peer.loop.create_future()
        self.transport.write(request)
        return self.waiter

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def _fail(self, error: PeerHTTPError) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(error)


class _Peer:
    """The connections to one peer (``http://host:port``)."""

    def __init__(self, base: str, limit: int, idle_s: float) -> None:
        parts = urlsplit(base)
        if parts.scheme != "http" or not parts.hostname:
            raise PeerHTTPError(f"peer URL {base!r}: only http://host:port is forwarded to")
        self.base = base
        self.host = parts.hostname
        self.port = parts.port or 80
        self.authority = parts.netloc
        self.idle_s = idle_s
        self.idle: deque[_Connection] = deque()
        self.slots = asyncio.Semaphore(limit)
        self.loop = asyncio.get_running_loop()

    async def connection(self, connect_s: float) -> tuple[_Connection, bool]:
        """An open connection, and whether it served a request before."""
        now = self.loop.time()
        while self.idle:
            found = self.idle.pop()  # the most recently used: the least likely to be stale
            if not found.closed and now - found.idle_since < self.idle_s:
                return found, True
            found.close()
        try:
            async with asyncio.timeout(connect_s):
                _, made = await self.loop.create_connection(
                    lambda: _Connection(self), self.host, self.port
                )
        except OSError as error:
            raise PeerHTTPError(f"{self.base} cannot be reached: {error}") from error
        return made, False

    def release(self, connection: _Connection) -> None:
        if connection.closed or not connection.reusable or connection.waiter is not None:
            connection.close()  # a response left half read cannot serve another request
            return
        connection.idle_since = self.loop.time()
        self.idle.append(connection)

    def forget(self, connection: _Connection) -> None:
        with contextlib.suppress(ValueError):  # not idle: in use, or dropped already
            self.idle.remove(connection)

    def close(self) -> None:
        while self.idle:
            self.idle.pop().close()


class PeerClient:
    """GETs to the group's peers: ``await get(base, target, timeout_s)`` gives the
    status and body, or raises :class:`PeerHTTPError` or :class:`TimeoutError`.
    ``headers`` go with every request."""

    def __init__(
        self, headers: dict[str, str], *, limit: int = 32, idle_s: float = 15.0, connect_s: float
    ) -> None:
        self._head = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        self.limit = limit
        self.idle_s = idle_s
        self.connect_s = connect_s
        self._peers: dict[str, _Peer] = {}

    def _peer(self, base: str) -> _Peer:
        found = self._peers.get(base)
        if found is None:
            found = self._peers[base] = _Peer(base, self.limit, self.idle_s)
        return found

    async def get(self, base: str, target: str, timeout_s: float) -> tuple[int, bytes]:
        """``GET target`` (path and query, percent-encoded) of the peer at ``base``."""
        peer = self._peer(base)
        request = f"GET {target} HTTP/1.1\r\nHost: {peer.authority}\r\n{self._head}\r\n".encode(
            "latin-1"
        )
        async with asyncio.timeout(timeout_s), peer.slots:
            for attempt in (1, 2):
                connection, reused = await peer.connection(min(self.connect_s, timeout_s))
                try:
                    return await connection.send(request)
                except _Stale:
                    if not reused or attempt == 2:
                        raise
                finally:
                    peer.release(connection)
        raise AssertionError("unreachable")  # pragma: no cover

    def close(self) -> None:
        for peer in self._peers.values():
            peer.close()
        self._peers = {}
