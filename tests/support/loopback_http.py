"""A loopback HTTP server for the unit tests of the peer clients (``start`` fixture in
tests/unit/conftest.py): it answers each request head with the bytes a test gives."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

Answer = Callable[[bytes], bytes | None]


def plain(status: int, body: bytes, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 %d X\r\ncontent-length: %d\r\n%s\r\n%s" % (status, len(body), extra, body)


class Server:
    """A loopback HTTP server: ``answer(request head)`` gives the bytes it writes back
    (None: it closes the connection instead). Counts connections and keeps every head."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.connections = 0
        self.heads: list[bytes] = []
        self.open: list[asyncio.StreamWriter] = []
        self.server: asyncio.Server | None = None

    @property
    def base(self) -> str:
        assert self.server is not None
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.open.append(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                self.heads.append(head)
                reply = self.answer(head)
                if reply is None:
                    break
                writer.write(reply)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    def drop_idle(self) -> None:
        """Close every connection from the server's side, as a keep-alive timeout does."""
        for writer in self.open:
            writer.close()
        self.open = []


Start = Callable[[Answer], Awaitable["Server"]]
