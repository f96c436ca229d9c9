"""Fixtures of the unit tests."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from tests.support.clock import Clock
from tests.support.loopback_http import Answer, Server, Start


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    """The engine's clock, moved by the test."""
    fake = Clock()
    monkeypatch.setattr("tables.engine.time", fake)
    monkeypatch.setattr("tables.task.time", fake)
    monkeypatch.setattr("tables.stalls.time", fake)
    return fake


@pytest.fixture
async def start() -> AsyncIterator[Start]:
    """Starts loopback HTTP servers, closed when the test ends."""
    servers: list[Server] = []

    async def started(answer: Answer) -> Server:
        server = Server(answer)
        server.server = await asyncio.start_server(server.serve, "127.0.0.1", 0)
        servers.append(server)
        return server

    yield started
    for server in servers:
        assert server.server is not None
        server.drop_idle()
        server.server.close()
        await server.server.wait_closed()
