"""The broker reachability probe behind /ready."""

from __future__ import annotations

import asyncio
import socket

from api.broker import BrokerProbe


def unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_a_listening_broker_is_reachable() -> None:
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        probe = BrokerProbe(f"127.0.0.1:{unused_port()},127.0.0.1:{port}")
        assert await probe.reachable()


async def test_no_listening_broker_is_unreachable() -> None:
    probe = BrokerProbe(f"127.0.0.1:{unused_port()}")
    assert not await probe.reachable()
