"""Is the Kafka cluster reachable? A cheap TCP probe for ``/ready``, cached briefly.

faust keeps a worker alive while its brokers are gone (and it should), so readiness
must ask separately: a worker that cannot reach any broker processes nothing and must
not be reported ready.
"""

from __future__ import annotations

import asyncio
import time

#: Seconds a probe's answer is reused; /ready may be polled often.
CACHE_SECONDS = 1.0
CONNECT_TIMEOUT = 0.5


class BrokerProbe:
    """Tries a TCP connection to each bootstrap broker until one answers."""

    def __init__(self, bootstrap: str) -> None:
        self.addresses = [_host_port(item) for item in bootstrap.split(",") if item.strip()]
        self._checked_at = float("-inf")
        self._reachable = True

    async def reachable(self) -> bool:
        now = time.monotonic()
        if now - self._checked_at >= CACHE_SECONDS:
            self._reachable = await self._probe()
            self._checked_at = time.monotonic()
        return self._reachable

    async def _probe(self) -> bool:
        for host, port in self.addresses:
            try:
                _, writer = await asyncio.wait_for(
                    asyncio.open_connection(host, port), CONNECT_TIMEOUT
                )
            except (OSError, TimeoutError):
                continue
            writer.close()
            return True
        return False


def _host_port(address: str) -> tuple[str, int]:
    host, _, port = address.strip().rpartition(":")
    return host.strip("[]"), int(port)
