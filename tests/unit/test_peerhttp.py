"""The client of forwarded reads against a real HTTP server on loopback: what it sends,
how it reuses, limits and drops connections, and how it fails."""

from __future__ import annotations

import asyncio

import pytest

from api.peerhttp import PeerClient, PeerHTTPError
from tests.support.loopback_http import Start, plain


def client(**kw: float) -> PeerClient:
    return PeerClient({"X-Streamstate-Forwarded": "http://me:1"}, connect_s=0.5, **kw)


async def test_a_get_gives_status_and_body_and_sends_the_headers(start: Start) -> None:
    server = await start(lambda head: plain(404, b'{"detail":"no key"}'))
    peer = client()
    status, body = await peer.get(server.base, "/tables/t/keys/a%2Fb?timeout_ms=5", 1.0)
    assert (status, body) == (404, b'{"detail":"no key"}')
    head = server.heads[0].decode()
    assert head.startswith("GET /tables/t/keys/a%2Fb?timeout_ms=5 HTTP/1.1\r\n")
    assert f"Host: {server.base.removeprefix('http://')}\r\n" in head
    assert "X-Streamstate-Forwarded: http://me:1\r\n" in head
    peer.close()


async def test_requests_one_after_another_share_one_connection(start: Start) -> None:
    server = await start(lambda head: plain(200, b"{}"))
    peer = client()
    for _ in range(5):
        assert await peer.get(server.base, "/x", 1.0) == (200, b"{}")
    assert server.connections == 1
    peer.close()


async def test_concurrent_requests_open_at_most_the_limit_of_connections(start: Start) -> None:
    server = await start(lambda head: plain(200, b"{}"))
    peer = client(limit=3)
    answers = await asyncio.gather(*(peer.get(server.base, f"/k{i}", 2.0) for i in range(12)))
    assert answers == [(200, b"{}")] * 12
    assert server.connections == 3
    peer.close()


async def test_a_chunked_body_is_given_whole(start: Start) -> None:
    chunked = (
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
    )
    server = await start(lambda head: chunked)
    peer = client()
    assert await peer.get(server.base, "/x", 1.0) == (200, b"abcde")
    assert await peer.get(server.base, "/y", 1.0) == (200, b"abcde")
    assert server.connections == 1
    peer.close()


async def test_a_connection_the_peer_closed_while_idle_is_replaced(start: Start) -> None:
    server = await start(lambda head: plain(200, b"{}"))
    peer = client()
    assert await peer.get(server.base, "/x", 1.0) == (200, b"{}")
    server.drop_idle()
    await asyncio.sleep(0.05)  # the close reaches the client
    assert await peer.get(server.base, "/x", 1.0) == (200, b"{}")
    assert server.connections == 2
    peer.close()


async def test_a_stale_connection_is_retried_once_on_a_new_one(start: Start) -> None:
    # The server closes the first connection as its second request arrives, before any
    # byte of the answer: the request goes again on a new connection.
    seen: list[int] = []

    def answer(head: bytes) -> bytes | None:
        seen.append(1)
        return None if len(seen) == 2 else plain(200, b"ok")

    server = await start(answer)
    peer = client()
    assert await peer.get(server.base, "/x", 1.0) == (200, b"ok")
    assert await peer.get(server.base, "/x", 1.0) == (200, b"ok")
    assert (server.connections, len(server.heads)) == (2, 3)
    peer.close()


async def test_a_fresh_connection_closed_before_the_answer_fails(start: Start) -> None:
    server = await start(lambda head: None)
    peer = client()
    with pytest.raises(PeerHTTPError, match="closed the connection"):
        await peer.get(server.base, "/x", 1.0)
    assert server.connections == 1  # not sent again: the peer refused it
    peer.close()


async def test_a_half_answer_fails_and_its_connection_is_not_reused(start: Start) -> None:
    calls: list[int] = []

    def answer(head: bytes) -> bytes:
        calls.append(1)
        return (
            plain(200, b"{}")
            if len(calls) > 1
            else b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n{"
        )

    server = await start(answer)
    peer = client()
    with pytest.raises(TimeoutError):
        await peer.get(server.base, "/slow", 0.2)
    assert await peer.get(server.base, "/x", 1.0) == (200, b"{}")
    assert server.connections == 2
    peer.close()


async def test_what_is_not_http_fails_with_the_parsers_reason(start: Start) -> None:
    server = await start(lambda head: b"SSH-2.0-OpenSSH\r\n\r\n")
    peer = client()
    with pytest.raises(PeerHTTPError, match="not HTTP"):
        await peer.get(server.base, "/x", 1.0)
    peer.close()


async def test_an_unreachable_peer_fails_at_once() -> None:
    probe = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = probe.sockets[0].getsockname()[1]
    probe.close()
    await probe.wait_closed()
    peer = client()
    with pytest.raises(PeerHTTPError, match="cannot be reached"):
        await peer.get(f"http://127.0.0.1:{port}", "/x", 1.0)


async def test_only_plain_http_peers_are_asked() -> None:
    with pytest.raises(PeerHTTPError, match="only http://host:port"):
        await client().get("https://127.0.0.1:1", "/x", 1.0)


async def test_a_connection_idle_too_long_is_not_reused(start: Start) -> None:
    server = await start(lambda head: plain(200, b"{}"))
    peer = client(idle_s=0.0)
    for _ in range(3):
        assert await peer.get(server.base, "/x", 1.0) == (200, b"{}")
    assert server.connections == 3
    peer.close()
