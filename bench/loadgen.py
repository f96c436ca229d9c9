"""A closed-loop HTTP load generator (wrk-style) for key reads, run as its own process.

    python -m bench.loadgen --base http://127.0.0.1:6066 --table word_counts \
        --keys-file keys.txt --duration 30 --connections 16

``connections`` coroutines each send one GET after another over a shared keep-alive
pool, cycling through the keys, for ``duration`` seconds. Prints one JSON object:
requests, non-200 answers, requests per second, latency percentiles in ms, the replica
answers seen and requests per second over time.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import orjson

from bench.stats import percentiles

QUANTILES = (50, 90, 99, 99.9)


@dataclass
class Tally:
    latencies_ms: list[float] = field(default_factory=list)
    finished_at: list[float] = field(default_factory=list)
    statuses: Counter[int] = field(default_factory=Counter)
    replicas: Counter[str] = field(default_factory=Counter)


async def client(
    session: aiohttp.ClientSession, urls: list[str], offset: int, until: float, tally: Tally
) -> None:
    n = offset
    while time.perf_counter() < until:
        url = urls[n % len(urls)]
        n += 1
        started = time.perf_counter()
        try:
            async with session.get(url) as answer:
                await answer.read()
                status = answer.status
                tally.replicas[answer.headers.get("X-Replica", "-")] += 1
        except (TimeoutError, aiohttp.ClientError):
            status = 0
        done = time.perf_counter()
        tally.latencies_ms.append((done - started) * 1000)
        tally.finished_at.append(done)
        tally.statuses[status] += 1


async def warm(session: aiohttp.ClientSession, url: str) -> None:
    async with session.get(url) as answer:
        await answer.read()


async def load(
    base: str, table: str, keys: list[str], duration: float, connections: int, query: str = ""
) -> Tally:
    suffix = f"?{query}" if query else ""
    urls = [f"{base}/tables/{table}/keys/{quote(key, safe='')}{suffix}" for key in keys]
    tally = Tally()
    connector = aiohttp.TCPConnector(limit=connections)
    timeout = aiohttp.ClientTimeout(total=10)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        # One warm-up pass opens the connections.
        await asyncio.gather(*(warm(session, u) for u in urls[:connections]))
        start = time.perf_counter()
        until = start + duration
        await asyncio.gather(
            *(client(session, urls, i * 7919, until, tally) for i in range(connections))
        )
    tally.finished_at = [t - start for t in tally.finished_at]
    return tally


def summarize(tally: Tally, duration: float) -> dict[str, Any]:
    per_second = Counter(int(t) for t in tally.finished_at)
    ok = tally.statuses.get(200, 0)
    return {
        "requests": len(tally.latencies_ms),
        "ok": ok,
        "failed": len(tally.latencies_ms) - ok,
        "statuses": {str(k): v for k, v in tally.statuses.items()},
        "replicas": dict(tally.replicas),
        "rps": ok / duration,
        "latency_ms": percentiles(tally.latencies_ms, QUANTILES),
        "per_second": sorted(per_second.items()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True)
    parser.add_argument("--table", default="word_counts")
    parser.add_argument("--keys-file", type=Path, required=True)
    parser.add_argument("--duration", type=float, default=30.0)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--query", default="", help="a query string for every read")
    args = parser.parse_args()
    keys = args.keys_file.read_text().split()
    tally = asyncio.run(
        load(args.base, args.table, keys, args.duration, args.connections, args.query)
    )
    sys.stdout.write(orjson.dumps(summarize(tally, args.duration)).decode() + "\n")


if __name__ == "__main__":
    main()
