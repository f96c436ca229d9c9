"""Calls to the other workers of the group, with short timeouts: forwarded reads through
the lean pooled client of :mod:`api.peerhttp`, change streams through aiohttp's.

Every call carries the marker header :data:`FORWARDED_HEADER` (a worker that receives it
answers from its own copies only, so a read is forwarded at most once) and the API token
when one is set. Callers pass only URLs taken from the group's assignment metadata.
"""

from __future__ import annotations

import logging
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


def quote_segment(segment: str) -> str:
    """Percent-encode one path segment; dots too, so ``.`` and ``..`` survive as keys."""
    return quote(segment, safe="").replace(".", "%2E")


@dataclass(frozen=True)
class PeerAnswer:
    """What a peer answered: status and decoded JSON body."""

    url: str
    status: int
    body: Any


class Peers:
    """The HTTP client a worker uses to reach its peers."""

    def __init__(self, own_url: str, token: str | None, timeout: float) -> None:
        self.own_url = own_url
        self.token = token
        self.timeout = timeout
        self._session: aiohttp.ClientSession | None = None
        self._reads = PeerClient(self._headers(), connect_s=min(0.5, timeout))
        #: the forwards counter of each (purpose, outcome), looked up once
        self._forwards: dict[tuple[str, str], Any] = {}

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(
                    limit=128, limit_per_host=32, keepalive_timeout=30, ttl_dns_cache=60
                ),
                timeout=aiohttp.ClientTimeout(
                    total=self.timeout, sock_connect=min(0.5, self.timeout)
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
        self, base: str, path: str, params: dict[str, Any], *, purpose: str, wait: float = 0.0
    ) -> PeerAnswer | None:
        """GET ``base + path`` (``path`` already percent-encoded); None when the peer
        cannot be reached or does not answer in time (``wait`` seconds more than the
        usual timeout for a read that may wait for a position)."""
        query = urlencode({k: v for k, v in params.items() if v is not None})
        target = f"{path}?{query}" if query else path
        try:
            status, raw = await self._reads.get(base, target, self.timeout + wait)
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

    def _count(self, purpose: str, outcome: str) -> None:
        counter = self._forwards.get((purpose, outcome))
        if counter is None:
            counter = self._forwards[(purpose, outcome)] = FORWARDS.labels(
                purpose=purpose, outcome=outcome
            )
        counter.inc()

    async def stream(
        self, base: str, path: str, last_event_id: str | None
    ) -> aiohttp.ClientResponse | None:
        """Open a peer's server-sent event stream; the caller reads and releases it. None
        when the peer does not answer 200."""
        headers = {"Accept": "text/event-stream"}
        if last_event_id is not None:
            headers["Last-Event-ID"] = last_event_id
        # No total timeout: the stream lasts; its heartbeats keep reads under sock_read.
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=min(0.5, self.timeout), sock_read=STREAM_READ_S
        )
        try:
            response = await self._client().get(
                URL(f"{base}{path}", encoded=True),
                headers=headers,
                timeout=timeout,
                allow_redirects=False,
            )
        except (TimeoutError, aiohttp.ClientError, OSError) as error:
            FORWARDS.labels(purpose="changes", outcome="unreachable").inc()
            logger.debug("peer %s stream: %s", base, error)
            return None
        FORWARDS.labels(purpose="changes", outcome=str(response.status)).inc()
        if response.status != 200:
            response.release()
            return None
        return response

    async def close(self) -> None:
        self._reads.close()
        if self._session is not None:
            await self._session.close()
            self._session = None
