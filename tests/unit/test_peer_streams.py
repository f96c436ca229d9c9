"""Change streams relayed from a peer, against a real HTTP server on loopback: each on a
connection of its own, with no cap per peer but the worker's bound, and never an open
that hangs."""

from __future__ import annotations

import asyncio

from api.peers import Peers
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
    firsts = [await asyncio.wait_for(s.content.readuntil(b"\n\n"), 5) for s in streams if s]
    assert firsts == [EVENT] * 100
    assert server.connections == 100
    assert b"Accept: text/event-stream" in server.heads[0]
    for stream in streams:
        assert stream is not None
        stream.release()
    await peers.close()


async def test_a_stream_the_peer_does_not_answer_in_time_is_not_opened(start: Start) -> None:
    server = await start(lambda head: b"")  # takes the request, never answers it
    peers = Peers("http://me:1", None, 1.0, stream_open_s=0.2)
    assert await asyncio.wait_for(peers.stream(server.base, "/k/changes", None), 5) is None
    await peers.close()


async def test_beyond_the_bound_a_stream_waits_for_another_to_end_or_is_not_opened(
    start: Start,
) -> None:
    server = await start(lambda head: STREAM)
    peers = Peers("http://me:1", None, 1.0, streams=2, stream_open_s=0.3)
    held = [await peers.stream(server.base, f"/k{i}/changes", None) for i in range(2)]
    assert None not in held
    assert await asyncio.wait_for(peers.stream(server.base, "/k2/changes", None), 5) is None
    waiting = asyncio.ensure_future(peers.stream(server.base, "/k3/changes", None))
    await asyncio.sleep(0.05)
    assert not waiting.done()
    held[0].release()  # type: ignore[union-attr]
    opened = await asyncio.wait_for(waiting, 5)
    assert opened is not None
    for stream in (held[1], opened):
        stream.release()  # type: ignore[union-attr]
    await peers.close()
