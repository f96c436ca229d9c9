"""Change streams relayed from a peer, against a real HTTP server on loopback: each on a
connection of its own, with no cap per peer but the worker's bound, and never an open
that hangs."""

from __future__ import annotations

import asyncio
import socket

import pytest

from api.peers import Peers, StreamNotOpened
from tests.support.loopback_http import Start

EVENT = b"event: absent\ndata: {}\n\n"
#: A change stream's head and first event; the stream stays open.
STREAM = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n" + EVENT


async def test_a_hundred_streams_from_one_peer_each_open_on_a_connection_of_its_own(
    start: Start,
) -> None:
    server = await start(lambda head: STREAM)
    peers = Peers("http://me:1", None, 1.0)
    opening = [peers.stream(server.base, f"/tables/t/keys/k{i}/changes", None) for i in range(100)]
    streams = await asyncio.wait_for(asyncio.gather(*opening), 10)
    firsts = [await asyncio.wait_for(s.content.readuntil(b"\n\n"), 5) for s in streams]
    assert firsts == [EVENT] * 100
    assert server.connections == 100
    assert b"Accept: text/event-stream" in server.heads[0]
    for stream in streams:
        stream.release()
    await peers.close()


async def test_a_stream_the_peer_does_not_answer_in_time_is_not_opened(start: Start) -> None:
    server = await start(lambda head: b"")  # takes the request, never answers it
    peers = Peers("http://me:1", None, 1.0, stream_open_s=0.2)
    with pytest.raises(StreamNotOpened, match=r"did not open it within 0\.2 s"):
        await asyncio.wait_for(peers.stream(server.base, "/k/changes", None), 5)
    await peers.close()


async def test_a_stream_the_peer_refuses_or_that_finds_no_peer_says_so(start: Start) -> None:
    server = await start(
        lambda head: b"HTTP/1.1 421 Misdirected Request\r\ncontent-length: 0\r\n\r\n"
    )
    peers = Peers("http://me:1", None, 1.0, stream_open_s=2.0)
    with pytest.raises(StreamNotOpened, match="answered 421"):
        await peers.stream(server.base, "/k/changes", None)
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        gone = f"http://127.0.0.1:{free.getsockname()[1]}"
    with pytest.raises(StreamNotOpened, match="cannot be reached"):
        await peers.stream(gone, "/k/changes", None)
    await peers.close()


async def test_beyond_the_bound_a_stream_waits_for_another_to_end_or_is_not_opened(
    start: Start,
) -> None:
    server = await start(lambda head: STREAM)
    peers = Peers("http://me:1", None, 1.0, streams=2, stream_open_s=0.3)
    held = [await peers.stream(server.base, f"/k{i}/changes", None) for i in range(2)]
    with pytest.raises(StreamNotOpened, match=r"relays at most 2 change streams"):
        await asyncio.wait_for(peers.stream(server.base, "/k2/changes", None), 5)
    waiting = asyncio.ensure_future(peers.stream(server.base, "/k3/changes", None))
    await asyncio.sleep(0.05)
    assert not waiting.done()
    held[0].release()
    opened = await asyncio.wait_for(waiting, 5)
    assert opened.status == 200
    for stream in (held[1], opened):
        stream.release()
    await peers.close()
