"""Plain reads of one peer asked for in the same turn of the event loop go to it as one
batch request, against a real HTTP server on loopback: what is sent, how each read gets
its own answer, and what happens when the peer refuses a batch or cannot be reached."""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

import orjson

from api.peers import BATCH_KEYS, BATCH_QUERY_CHARS, BATCH_ROUTE, Peers, batch_targets
from tests.support.loopback_http import Start, plain


def target_of(head: bytes) -> str:
    return head.split(b" ", 2)[1].decode("latin-1")


def owner(knows_batches: bool = True) -> Any:
    """A peer that answers each key with its own name, in batches when it knows them."""

    def answer(head: bytes) -> bytes:
        parts = urlsplit(target_of(head))
        if parts.path.startswith(BATCH_ROUTE):
            if not knows_batches:
                return plain(404, b'{"detail":"Not Found"}')
            keys = [value for _, value in parse_qsl(parts.query, strict_parsing=True)]
            found = [[200, {"key": k, "replica": "active"}] for k in keys]
            return plain(200, orjson.dumps({"answers": found}))
        key = unquote(parts.path.rsplit("/", 1)[1])
        return plain(200, orjson.dumps({"key": key, "replica": "active", "single": True}))

    return answer


async def test_reads_asked_for_in_one_turn_go_to_the_peer_as_one_request(start: Start) -> None:
    server = await start(owner())
    peers = Peers("http://me:1", None, 2.0)
    keys = ["a", "b/c", "d e", "f+g", "h%i", "Über", ".."]
    answers = await asyncio.gather(
        *(peers.read_soon(server.base, "word_counts", key, purpose="owner") for key in keys)
    )
    assert [a.body["key"] for a in answers if a is not None] == keys
    assert {a.status for a in answers if a is not None} == {200}
    assert len(server.heads) == 1
    head = server.heads[0].decode("latin-1")
    assert head.startswith(f"GET {BATCH_ROUTE}word_counts?key=a&key=b%2Fc&key=d%20e")
    assert "X-Streamstate-Forwarded: http://me:1\r\n" in head
    await peers.close()


async def test_a_read_alone_in_its_turn_is_a_plain_get(start: Start) -> None:
    server = await start(owner())
    peers = Peers("http://me:1", "tok", 2.0)
    answer = await peers.read_soon(server.base, "word_counts", "a.b", purpose="owner")
    assert answer is not None
    assert answer.body == {"key": "a.b", "replica": "active", "single": True}
    head = server.heads[0].decode("latin-1")
    assert head.startswith("GET /tables/word_counts/keys/a%2Eb HTTP/1.1\r\n")
    assert "Authorization: Bearer tok\r\n" in head
    # reads in later turns are sent in later requests
    await peers.read_soon(server.base, "word_counts", "x", purpose="owner")
    assert len(server.heads) == 2
    await peers.close()


async def test_reads_of_two_tables_or_two_peers_go_in_separate_batches(start: Start) -> None:
    first, second = await start(owner()), await start(owner())
    peers = Peers("http://me:1", None, 2.0)
    asked = [
        (first.base, "word_counts", "a"),
        (first.base, "inventory", "s1"),
        (second.base, "word_counts", "b"),
        (first.base, "word_counts", "c"),
        (first.base, "inventory", "s2"),
        (second.base, "word_counts", "d"),
    ]
    answers = await asyncio.gather(
        *(peers.read_soon(base, table, key, purpose="owner") for base, table, key in asked)
    )
    assert [a.body["key"] for a in answers if a is not None] == [key for _, _, key in asked]
    assert sorted(target_of(h) for h in first.heads) == [
        f"{BATCH_ROUTE}inventory?key=s1&key=s2",
        f"{BATCH_ROUTE}word_counts?key=a&key=c",
    ]
    assert [target_of(h) for h in second.heads] == [f"{BATCH_ROUTE}word_counts?key=b&key=d"]
    await peers.close()


async def test_a_peer_that_refuses_batches_gets_single_reads(start: Start) -> None:
    server = await start(owner(knows_batches=False))
    peers = Peers("http://me:1", None, 2.0)

    async def three() -> list[Any]:
        return await asyncio.gather(
            *(peers.read_soon(server.base, "t", k, purpose="owner") for k in "xyz")
        )

    answers = await three()
    assert [(a.body["key"], a.body["single"]) for a in answers] == [
        ("x", True),
        ("y", True),
        ("z", True),
    ]
    assert target_of(server.heads[0]).startswith(BATCH_ROUTE)
    assert len(server.heads) == 4  # the refused batch, then each read
    answers = await three()  # no batch is tried again for a while
    assert [a.body["key"] for a in answers] == ["x", "y", "z"]
    assert not any(target_of(h).startswith(BATCH_ROUTE) for h in server.heads[4:])
    await peers.close()


async def test_a_batch_refused_for_a_moment_is_sent_as_single_reads_that_once(
    start: Start,
) -> None:
    refused = [True]

    def starting(head: bytes) -> bytes:  # a peer still starting: 503 to the first batch
        if target_of(head).startswith(BATCH_ROUTE) and refused:
            refused.pop()
            return plain(503, b'{"detail":"starting"}')
        return owner()(head)

    server = await start(starting)
    peers = Peers("http://me:1", None, 2.0)
    for _ in range(2):
        answers = await asyncio.gather(
            *(peers.read_soon(server.base, "t", k, purpose="owner") for k in "ab")
        )
        assert [a.body["key"] for a in answers if a is not None] == ["a", "b"]
    targets = [target_of(h) for h in server.heads]
    # the refused batch, its two single reads, then a batch again
    assert [t.startswith(BATCH_ROUTE) for t in targets] == [True, False, False, True]
    await peers.close()


async def test_a_peer_that_cannot_be_reached_gives_no_answer_to_any_read() -> None:
    peers = Peers("http://me:1", None, 0.5)
    answers = await asyncio.gather(
        *(peers.read_soon("http://127.0.0.1:9", "t", k, purpose="owner") for k in "abc")
    )
    assert answers == [None, None, None]
    await peers.close()


async def test_an_answer_that_is_not_a_batch_answer_falls_back_to_single_reads(
    start: Start,
) -> None:
    def short(head: bytes) -> bytes:  # one answer for two keys
        if target_of(head).startswith(BATCH_ROUTE):
            return plain(200, b'{"answers": [[200, {}]]}')
        return plain(200, b'{"single": true}')

    server = await start(short)
    peers = Peers("http://me:1", None, 2.0)
    answers = await asyncio.gather(
        *(peers.read_soon(server.base, "t", k, purpose="owner") for k in "ab")
    )
    assert [a.body for a in answers if a is not None] == [{"single": True}] * 2
    await peers.close()


def test_batches_are_split_by_key_count_and_query_length() -> None:
    keys = [f"k{i}" for i in range(BATCH_KEYS * 2 + 1)]
    targets = batch_targets("t", keys)
    assert [count for _, count in targets] == [BATCH_KEYS, BATCH_KEYS, 1]
    long = ["x" * 1000] * 20
    targets = batch_targets("t", long)
    assert sum(count for _, count in targets) == 20
    assert all(len(urlsplit(target).query) <= BATCH_QUERY_CHARS for target, _ in targets)
    sent = [value for target, _ in targets for _, value in parse_qsl(urlsplit(target).query)]
    assert sent == long


async def test_a_read_with_a_grace_gives_up_on_a_silent_peer_within_it(start: Start) -> None:
    server = await start(lambda head: b"")  # takes the request, never answers it
    peers = Peers("http://me:1", None, 5.0)
    # Waited 0.2 s for a position, then the grace of 0.1 s, not the 5-s forward timeout:
    # wait_for's own bound of 2 s would raise first if the grace were not applied.
    answer = await asyncio.wait_for(
        peers.get(server.base, "/tables/t/keys/k", {}, purpose="owner", wait=0.2, grace=0.1), 2
    )
    assert answer is None
    assert len(server.heads) == 1
    await peers.close()
