"""Read your writes: how long from a write's answer to the answer of a read that carries
its token, and what a token costs a read.

Two workers. Each round writes one restock through ``POST /topics/item-events/records``
on one worker and reads the store's inventory with the answer's token, alternately from
that worker and from the other; the same for a text line and one of its words in
``word_counts``, which it reaches through the repartition topic. The cost of a token is
the rate of plain key reads of local keys against the rate of the same reads carrying an
already satisfied token, by the same load generator.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import aiohttp
import orjson

from bench.config import Sizes
from bench.procs import Worker
from bench.scenarios import Outcome
from bench.scenarios.queries import load
from bench.stats import percentiles


async def _round_trip(
    session: aiohttp.ClientSession,
    writer: Worker,
    reader: Worker,
    topic: str,
    value: Any,
    table: str,
    key: str,
) -> tuple[float, str]:
    """(ms from the write's answer to the token read's answer, the token)."""
    body = {"records": [{"key": None, "value": value}]}
    async with session.post(f"{writer.url}/topics/{topic}/records", json=body) as answer:
        written = orjson.loads(await answer.read())
        if answer.status != 200:
            raise RuntimeError(f"write answered {answer.status}: {written}")
    token = written["token"]
    started = time.perf_counter()
    query = urlencode({"consistent_with": token, "timeout_ms": 10_000})
    url = f"{reader.url}/tables/{table}/keys/{quote(key, safe='')}?{query}"
    async with session.get(url) as answer:
        read = orjson.loads(await answer.read())
        if answer.status != 200:
            raise RuntimeError(f"token read answered {answer.status}: {read}")
    return (time.perf_counter() - started) * 1000, token


#: Rounds before the measured ones: the API's producer connects on its first write.
WARM_UP = 5
#: Plain and token reads are measured in alternating slices, so that what else the
#: machine does weighs on both alike; each rate is the median of its slices.
SLICES = 3


async def _rounds(a: Worker, b: Worker, rounds: int) -> dict[str, Any]:
    stores: list[float] = []
    words: list[float] = []
    token = ""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        for n in range(-WARM_UP, rounds):
            reader = a if n % 2 else b
            store = f"ryw-store-{n % 50}"
            event = {
                "event_id": uuid.uuid4().hex,
                "store_id": store,
                "sku": "ryw-sku",
                "kind": "restock",
                "quantity": 1,
                "ts": int(time.time() * 1000),
            }
            store_ms, _ = await _round_trip(
                session, a, reader, "item-events", event, "inventory", store
            )
            word = f"ryw{n + WARM_UP}"
            word_ms, token = await _round_trip(
                session, a, reader, "text-lines", f"{word} read your writes", "word_counts", word
            )
            if n >= 0:  # the warm-up rounds are not counted
                stores.append(store_ms)
                words.append(word_ms)
    return {"stores_ms": stores, "words_ms": words, "token": token}


def run(a: Worker, b: Worker, local_keys: list[str], sizes: Sizes, work: Path) -> Outcome:
    """Both workers ready and holding word_counts; ``local_keys`` are keys ``a`` owns."""
    rounds = 50 if sizes.mode.startswith("quick") else 400
    found = asyncio.run(_rounds(a, b, rounds))
    stores = percentiles(found["stores_ms"], (50, 99))
    words = percentiles(found["words_ms"], (50, 99))
    query = urlencode({"consistent_with": found["token"]})
    slices = replace(sizes, iq_duration_s=max(2.0, sizes.iq_duration_s / SLICES))
    plains, tokens = [], []
    for n in range(SLICES):
        plains.append(load(a, local_keys, slices, work, f"plain{n}"))
        tokens.append(load(a, local_keys, slices, work, f"token{n}", query))
    plain = sorted(plains, key=lambda r: float(r["rps"]))[SLICES // 2]
    with_token = sorted(tokens, key=lambda r: float(r["rps"]))[SLICES // 2]
    figures = {
        "ryw_p50_ms": stores["p50"],
        "ryw_p99_ms": stores["p99"],
        "ryw_words_p50_ms": words["p50"],
        "ryw_words_p99_ms": words["p99"],
        "plain_read_rps": plain["rps"],
        "token_read_rps": with_token["rps"],
    }
    notes = [
        f"{rounds} rounds (after {WARM_UP} not counted) on two workers: a restock written "
        "through POST /topics/item-events/records on one, its store read with the answer's "
        "token alternately from the same worker and the other; the same for a text line "
        "and one of its words (through the repartition topic). Latency from the write's "
        "answer to the read's answer.",
        "Token cost: the load generator's plain reads of keys the first worker owns against "
        f"the same reads with a satisfied token ({sizes.iq_connections} connections), in "
        f"{SLICES} alternating slices of {slices.iq_duration_s:.0f} s each, the median "
        f"slice's rate of each; plain {[round(r['rps']) for r in plains]} req/s, with token "
        f"{[round(r['rps']) for r in tokens]}; non-200 answers: "
        f"{sum(r['failed'] for r in plains + tokens)}.",
    ]
    return Outcome(figures=figures, notes=notes, details={"rounds": found})
