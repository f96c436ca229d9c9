"""Calls to the other workers of the group, with short timeouts: forwarded reads through
the lean pooled client of :mod:`api.peerhttp`, change streams through aiohttp's. Each
relayed change stream holds a connection of its own to the key's owner for as long as it
lasts, none taken from the reads' pool and none capped per peer: reads are not starved by
streams, nor streams by reads or by each other (up to :data:`RELAYED_STREAMS`).

Plain key reads (no consistency parameters, no window) of one peer's table asked for in
the same turn of the event loop go to it as one request, ``GET /internal/reads/{table}
?key=..&key=..`` (:data:`BATCH_ROUTE`): the peer answers each key as it answers a forwarded
read, and each read gets its own answer. A read alone in its turn goes as a plain
``GET /tables/{table}/keys/{key}``, and so do the reads of a peer that does not know the
batch route (an older version, during a rolling upgrade).

Every call carries the marker header :data:`FORWARDED_HEADER` (a worker that receives it
answers from its own copies only, so a read is forwarded at most once) and the API token
when one is set. Callers pass only URLs taken from the group's assignment metadata.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

import aiohttp
import orjson
from yarl import URL

from api.metrics import FORWARDS
from api.peerhttp import PeerClient, PeerHTTPError

logger = logging.getLogger(__name__)

#: Marks a request sent by a worker; its value is the sender's canonical URL.
FORWARDED_HEADER = "X-Streamstate-Forwarded"
#: Longest silence on a relayed change stream (its heartbeats come every 15 s).
STREAM_READ_S = 40.0
#: The most change streams a worker relays at once, from all its peers together (each
#: holds a connection to the key's owner), unless ``STREAMSTATE_RELAYED_STREAMS`` says
#: otherwise. One more waits for one of them to end, within :data:`STREAM_OPEN_S`.
RELAYED_STREAMS = 4096
#: Longest wait for a relayed stream to open: a connection, then the head of the owner's
#: answer. A stream has no standby to turn to, unlike a read: it waits longer than a read
#: would, for an owner that opens hundreds of streams at once.
STREAM_OPEN_S = 10.0
#: The path of a peer's batch of plain key reads; the table's name follows.
BATCH_ROUTE = "/internal/reads/"
#: The most keys in one batch, and the longest query string of one (percent-encoded).
BATCH_KEYS = 64
BATCH_QUERY_CHARS = 8000
#: How long a peer that does not know the batch route is sent single reads before it is
#: tried again, and the statuses that say it does not know it.
UNBATCHED_S = 60.0
UNKNOWN_ROUTE = frozenset({404, 405})


def quote_segment(segment: str) -> str:
    """Percent-encode one path segment; dots too, so ``.`` and ``..`` survive as keys."""
    return quote(segment, safe="").replace(".", "%2E")


@dataclass(frozen=True)
class PeerAnswer:
    """What a peer answered: status and decoded JSON body."""

    url: str
    status: int
    body: Any


#: One plain read waiting for its batch: the key, its answer's future, and its purpose.
_Read = tuple[str, "asyncio.Future[PeerAnswer | None]", str]


def batch_targets(table: str, keys: list[str]) -> list[tuple[str, int]]:
    """The requests of a batch of ``keys``: (path and query, number of keys), in order,
    each within :data:`BATCH_KEYS` keys and :data:`BATCH_QUERY_CHARS` characters."""
    head = f"{BATCH_ROUTE}{quote_segment(table)}?"
    targets: list[tuple[str, int]] = []
    parts: list[str] = []
    chars = 0
    for key in keys:
        part = "key=" + quote(key, safe="")
        if parts and (len(parts) == BATCH_KEYS or chars + len(part) > BATCH_QUERY_CHARS):
            targets.append((head + "&".join(parts), len(parts)))
            parts, chars = [], 0
        parts.append(part)
        chars += len(part) + 1
    if parts:
        targets.append((head + "&".join(parts), len(parts)))
    return targets


class StreamNotOpened(Exception):
    """A peer's change stream could not be opened; the message says why."""


class Peers:
    """The HTTP client a worker uses to reach its peers."""

    def __init__(
        self,
        own_url: str,
        token: str | None,
        timeout: float,
        *,
        streams: int = RELAYED_STREAMS,
        stream_open_s: float = STREAM_OPEN_S,
    ) -> None:
        self.own_url = own_url
        self.token = token
        self.timeout = timeout
        self.streams = streams
        self.stream_open_s = stream_open_s
        self._session: aiohttp.ClientSession | None = None
        self._reads = PeerClient(self._headers(), connect_s=min(0.5, timeout))
        #: the forwards counter of each (purpose, outcome), looked up once
        self._forwards: dict[tuple[str, str], Any] = {}
        #: plain reads asked for in this turn of the event loop, by peer and table
        self._waiting: dict[tuple[str, str], list[_Read]] = {}
        #: peers that do not know the batch route, and until when they get single reads
        self._unbatched: dict[str, float] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def _streams(self) -> aiohttp.ClientSession:
        """The client of relayed change streams: a connection each, closed with it."""
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(
                    limit=self.streams, limit_per_host=0, force_close=True, ttl_dns_cache=60
                ),
                headers=self._headers(),
            )
        return self._session

    def _headers(self) -> dict[str, str]:
        headers = {FORWARDED_HEADER: self.own_url, "Accept": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        return headers

    async def get(
        self,
        base: str,
        path: str,
        params: dict[str, Any],
        *,
        purpose: str,
        wait: float = 0.0,
        grace: float | None = None,
    ) -> PeerAnswer | None:
        """GET ``base + path`` (``path`` already percent-encoded); None when the peer
        cannot be reached or does not answer in time: ``wait`` seconds (how long a read
        may wait there for a position) and then the usual timeout, or ``grace`` if that
        is shorter (for a read whose client gave its own timeout)."""
        query = urlencode({k: v for k, v in params.items() if v is not None})
        target = f"{path}?{query}" if query else path
        slack = self.timeout if grace is None else min(self.timeout, grace)
        try:
            status, raw = await self._reads.get(base, target, wait + slack)
        except (TimeoutError, PeerHTTPError) as error:
            outcome = "timeout" if isinstance(error, TimeoutError) else "unreachable"
            self._count(purpose, outcome)
            logger.debug("peer %s %s: %s", base, outcome, error)
            return None
        try:
            body = orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError:
            body = None
        self._count(purpose, str(status))
        return PeerAnswer(base, status, body)

    def read_soon(
        self, base: str, table: str, key: str, *, purpose: str
    ) -> asyncio.Future[PeerAnswer | None]:
        """A plain read of ``key`` in ``table`` from the peer's own copy, sent in one
        request with the other plain reads of the same peer and table asked for in this
        turn of the event loop. The future gives what :meth:`get` gives for the read."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[PeerAnswer | None] = loop.create_future()
        if not self._waiting:
            loop.call_soon(self._send_waiting)
        self._waiting.setdefault((base, table), []).append((key, future, purpose))
        return future

    def _send_waiting(self) -> None:
        waiting, self._waiting = self._waiting, {}
        for (base, table), reads in waiting.items():
            task = asyncio.get_running_loop().create_task(self._send_reads(base, table, reads))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _send_reads(self, base: str, table: str, reads: list[_Read]) -> None:
        try:
            if len(reads) == 1 or self._unbatched.get(base, 0.0) > time.monotonic():
                await asyncio.gather(*(self._send_one(base, table, read) for read in reads))
                return
            sends, done = [], 0
            for target, count in batch_targets(table, [key for key, _, _ in reads]):
                sends.append(self._send_batch(base, table, target, reads[done : done + count]))
                done += count
            await asyncio.gather(*sends)
        finally:
            for _, future, _ in reads:  # a read no answer reached: none
                if not future.done():
                    future.set_result(None)

    async def _send_one(self, base: str, table: str, read: _Read) -> None:
        key, future, purpose = read
        path = f"/tables/{quote_segment(table)}/keys/{quote_segment(key)}"
        answer = await self.get(base, path, {}, purpose=purpose)
        if not future.done():
            future.set_result(answer)

    async def _send_batch(self, base: str, table: str, target: str, reads: list[_Read]) -> None:
        try:
            status, raw = await self._reads.get(base, target, self.timeout)
        except (TimeoutError, PeerHTTPError) as error:
            outcome = "timeout" if isinstance(error, TimeoutError) else "unreachable"
            for _, _, purpose in reads:
                self._count(purpose, outcome)
            logger.debug("peer %s batch of %d reads %s: %s", base, len(reads), outcome, error)
            return
        answers = _batch_answers(raw, len(reads)) if status == 200 else None
        if answers is None:
            # Not a batch's answer: each read on its own, which gets its own answer (a
            # starting peer's 503, say). A peer that does not know the route (an older
            # version) gets single reads for a while.
            if status in UNKNOWN_ROUTE:
                logger.info("peer %s answered %d to a batch of reads: single reads", base, status)
                self._unbatched[base] = time.monotonic() + UNBATCHED_S
            await asyncio.gather(*(self._send_one(base, table, read) for read in reads))
            return
        for (_, future, purpose), (code, body) in zip(reads, answers, strict=True):
            self._count(purpose, str(code))
            if not future.done():
                future.set_result(PeerAnswer(base, code, body))

    def _count(self, purpose: str, outcome: str) -> None:
        counter = self._forwards.get((purpose, outcome))
        if counter is None:
            counter = self._forwards[(purpose, outcome)] = FORWARDS.labels(
                purpose=purpose, outcome=outcome
            )
        counter.inc()

    async def stream(
        self, base: str, path: str, last_event_id: str | None
    ) -> aiohttp.ClientResponse:
        """Open a peer's server-sent event stream; the caller reads and releases it.
        Raises :class:`StreamNotOpened`, saying why, when the peer does not answer 200, or
        not within :attr:`stream_open_s` (which a stream waits at most for a connection
        when this worker relays :attr:`streams`)."""
        headers = {"Accept": "text/event-stream"}
        if last_event_id is not None:
            headers["Last-Event-ID"] = last_event_id
        # No total timeout: the stream lasts; its heartbeats keep reads under sock_read.
        # Its opening, the connection included, is bounded by stream_open_s.
        timeout = aiohttp.ClientTimeout(total=None, sock_read=STREAM_READ_S)
        try:
            async with asyncio.timeout(self.stream_open_s):
                response = await self._streams().get(
                    URL(f"{base}{path}", encoded=True),
                    headers=headers,
                    timeout=timeout,
                    allow_redirects=False,
                )
        except (TimeoutError, aiohttp.ClientError, OSError) as error:
            outcome = "timeout" if isinstance(error, TimeoutError) else "unreachable"
            FORWARDS.labels(purpose="changes", outcome=outcome).inc()
            logger.debug("peer %s stream %s: %s", base, outcome, error)
            if outcome == "unreachable":
                raise StreamNotOpened(f"the owner {base} cannot be reached") from None
            raise StreamNotOpened(
                f"the owner {base} did not open it within {self.stream_open_s:g} s, or no "
                f"connection was free: this worker relays at most {self.streams:,} change "
                "streams at once (STREAMSTATE_RELAYED_STREAMS), and one more waits for "
                "another to end"
            ) from None
        FORWARDS.labels(purpose="changes", outcome=str(response.status)).inc()
        if response.status != 200:
            response.release()
            raise StreamNotOpened(f"the owner {base} answered {response.status}")
        return response

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        self._reads.close()
        if self._session is not None:
            await self._session.close()
            self._session = None


def _batch_answers(raw: bytes, count: int) -> list[tuple[int, Any]] | None:
    """The ``count`` (status, body) pairs of a batch's answer, or None when it is not one."""
    try:
        found = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    answers = found.get("answers") if isinstance(found, dict) else None
    if not isinstance(answers, list) or len(answers) != count:
        return None
    if not all(isinstance(a, list) and len(a) == 2 and isinstance(a[0], int) for a in answers):
        return None
    return [(status, body) for status, body in answers]
