"""Dead members: a peer whose worker process is gone is removed from the group at once.

Workers are static members of the group (``group.instance.id`` is their canonical URL),
so a worker that restarts takes its partitions back without a rebalance; but a worker
that does not come back would keep them until its session expires. Every worker probes
its peers' HTTP ports; a port that *refuses* the connection on consecutive probes belongs
to a process that is gone (its host answered: nothing listens there), and the first peer
to see that removes the member on its behalf (KIP-345), so the group rebalances and the
standbys take over in seconds.

A worker that is alive but out of reach (a network partition, a hung host) is not
evicted: those probes time out or fail otherwise, and only a refusal counts; such a
worker leaves the group when its session expires, as before. A worker that restarts
after being removed joins again with a rebalance, as a new member does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from urllib.parse import urlsplit

logger = logging.getLogger(__name__)

#: Removes the named static members from the group: instance id -> outcome.
Evict = Callable[[list[str]], Awaitable[dict[str, str]]]


async def refuses(url: str, seconds: float = 0.3) -> bool:
    """Whether the host of ``url`` refuses a connection to its port (nothing listens)."""
    parts = urlsplit(url)
    host, port = parts.hostname, parts.port
    if host is None or port is None:
        return False
    try:
        _reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), seconds)
    except ConnectionRefusedError:
        return True
    except (OSError, TimeoutError):
        return False  # unreachable is not gone: it may be partitioned away
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return False


class DeadMembers:
    """Probes the peers and evicts those whose port refused ``probes`` times in a row."""

    def __init__(
        self,
        peers: Callable[[], Iterable[str]],
        evict: Evict,
        *,
        interval: float = 0.5,
        probes: int = 2,
        again_after: float = 15.0,
    ) -> None:
        self.peers = peers
        self.evict = evict
        self.interval = interval
        self.probes = probes
        #: an evicted member still named by the assignment this long later is evicted again
        self.again_after = again_after
        self.refusals: dict[str, int] = {}
        self.evicted: dict[str, float] = {}
        self.evictions = 0

    async def run(self) -> None:
        while True:
            try:
                await self.probe_once()
            except Exception:  # never let the watch die; the next round tries again
                logger.exception("probing the group's members failed")
            await asyncio.sleep(self.interval)

    async def probe_once(self) -> list[str]:
        """One round of probes; returns the members evicted in it."""
        peers = sorted(set(self.peers()))
        answers = await asyncio.gather(*(refuses(url) for url in peers))
        now = time.monotonic()
        dead = []
        for url, refused in zip(peers, answers, strict=True):
            self.refusals[url] = self.refusals.get(url, 0) + 1 if refused else 0
            recently = now - self.evicted.get(url, -self.again_after) < self.again_after
            if self.refusals[url] >= self.probes and not recently:
                dead.append(url)
        for url in set(self.refusals) - set(peers):
            del self.refusals[url]
        if not dead:
            return []
        outcome = await self.evict(dead)
        for url in dead:
            self.evicted[url] = now
            self.evictions += 1
            logger.warning(
                "member %s refused %d probes in a row: its worker is gone; removed from "
                "the group (%s)",
                url,
                self.refusals[url],
                outcome.get(url, "no answer"),
            )
        return dead
