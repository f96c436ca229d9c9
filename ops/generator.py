"""The demo event generator: realistic text lines, a product catalogue, store events and
payments, written at a steady rate.

    python -m ops.generator --bootstrap 127.0.0.1:9092 --rate 20

It writes the catalogue to ``products`` first, then every second ``rate`` lines to
``text-lines``, ``rate`` events to ``item-events`` and a payment for most sales to
``payments``. ``--count`` stops after that many item events; Ctrl-C stops it cleanly.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import signal
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiokafka import AIOKafkaProducer

from agents.schemas import demo_topic_specs
from core.admin import ensure_topics

CATEGORIES = {
    "produce": ["apples", "bananas", "carrots", "spinach", "tomatoes"],
    "dairy": ["milk", "yoghurt", "butter", "cheddar", "crème fraîche"],
    "bakery": ["baguette", "croissant", "rye bread", "bagels"],
    "household": ["detergent", "sponges", "bin bags", "light bulbs"],
    "drinks": ["coffee", "green tea", "orange juice", "sparkling water"],
}
STORES = [f"store-{n:03d}" for n in range(1, 13)]
SENTENCES = [
    "The quick brown fox jumps over the lazy dog",
    "Stream processing keeps state close to the data",
    "Every table is backed by a compacted changelog topic",
    "L'état du magasin change à chaque vente",
    "Die Straße vor dem Laden ist heute voller Kunden",
    "ΣΟΦΙΑ counts words in Greek too",
    "don't panic: user_42 restocked 12 items at 09:30",
    "Kafka Streams and faust both turn logs into tables",
]


@dataclass
class Catalogue:
    """Products by SKU, with a base price each."""

    products: dict[str, dict[str, Any]] = field(default_factory=dict)
    prices: dict[str, float] = field(default_factory=dict)

    @classmethod
    def build(cls, rng: random.Random) -> Catalogue:
        catalogue = cls()
        for category, names in CATEGORIES.items():
            for index, name in enumerate(names):
                sku = f"{category[:3].upper()}-{index:04d}"
                catalogue.products[sku] = {"sku": sku, "name": name, "category": category}
                catalogue.prices[sku] = round(rng.uniform(0.5, 25.0), 2)
        return catalogue


def item_event(rng: random.Random, catalogue: Catalogue, now_ms: int) -> dict[str, Any]:
    """One store event: mostly sales, some restocks and stock adjustments."""
    sku = rng.choice(list(catalogue.products))
    store = rng.choice(STORES)
    kind = rng.choices(["sale", "restock", "adjust"], weights=[80, 15, 5])[0]
    event: dict[str, Any] = {
        "event_id": str(uuid.UUID(int=rng.getrandbits(128))),
        "store_id": store,
        "sku": sku,
        "kind": kind,
        "ts": now_ms,
    }
    if kind == "sale":
        event["quantity"] = rng.randint(1, 5)
        event["unit_price"] = catalogue.prices[sku]
    elif kind == "restock":
        event["quantity"] = rng.randint(20, 100)
    else:
        event["quantity"] = rng.choice([-3, -2, -1, 1, 2])
    return event


def payment_for(rng: random.Random, sale: dict[str, Any], now_ms: int) -> dict[str, Any]:
    return {
        "payment_id": str(uuid.UUID(int=rng.getrandbits(128))),
        "sale_event_id": sale["event_id"],
        "store_id": sale["store_id"],
        "amount": round(sale["quantity"] * sale["unit_price"], 2),
        "ts": now_ms + rng.randint(0, 120_000),
    }


async def run(
    bootstrap: str,
    rate: float,
    count: int | None,
    seed: int | None,
    partitions: int = 8,
    retention_ms: int = -1,
    replication_factor: int = 1,
) -> int:
    """Produce until stopped (or ``count`` item events); return the item events sent."""
    rng = random.Random(seed)
    catalogue = Catalogue.build(rng)
    await ensure_topics(bootstrap, demo_topic_specs(partitions, retention_ms), replication_factor)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    await producer.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(signum, stop.set)
    sent = 0
    try:
        for sku, product in catalogue.products.items():
            await producer.send("products", orjson.dumps(product), key=sku.encode())
        interval = 1.0 / rate
        while not stop.is_set() and (count is None or sent < count):
            now_ms = int(time.time() * 1000)
            await producer.send("text-lines", rng.choice(SENTENCES).encode())
            event = item_event(rng, catalogue, now_ms)
            key = event["store_id"].encode()
            await producer.send("item-events", orjson.dumps(event), key=key)
            if event["kind"] == "sale" and rng.random() < 0.9:
                await producer.send(
                    "payments", orjson.dumps(payment_for(rng, event, now_ms)), key=key
                )
            sent += 1
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=interval)
        await producer.flush()
    finally:
        await producer.stop()
    return sent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", default="127.0.0.1:9092")
    parser.add_argument("--rate", type=float, default=20.0, help="item events per second")
    parser.add_argument("--count", type=int, default=None, help="stop after this many")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--partitions", type=int, default=8, help="for topics it creates")
    parser.add_argument("--replication-factor", type=int, default=1)
    args = parser.parse_args()
    sent = asyncio.run(
        run(
            args.bootstrap,
            args.rate,
            args.count,
            args.seed,
            partitions=args.partitions,
            replication_factor=args.replication_factor,
        )
    )
    print(f"generator: sent {sent} item events")


if __name__ == "__main__":
    main()
