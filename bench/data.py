"""Deterministic benchmark data: text lines, store events, changelog records."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator

import orjson

from bench.kafka import Pair
from ops.generator import SENTENCES, Catalogue

VOCABULARY_SIZE = 5000
WORDS_PER_LINE = 10


def vocabulary(rng: random.Random) -> list[str]:
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = {
        "".join(rng.choice(letters) for _ in range(rng.randint(2, 9)))
        for _ in range(VOCABULARY_SIZE * 2)
    }
    return sorted(words)[:VOCABULARY_SIZE]


def text_lines(count: int, seed: int = 7) -> Iterator[Pair]:
    """``count`` lines of ten words; one in fifty is a non-ASCII sentence of the demo."""
    rng = random.Random(seed)
    words = vocabulary(rng)
    for n in range(count):
        if n % 50 == 49:
            yield None, SENTENCES[n % len(SENTENCES)].encode()
        else:
            yield None, " ".join(rng.choices(words, k=WORDS_PER_LINE)).encode()


def catalogue(seed: int = 11) -> Catalogue:
    return Catalogue.build(random.Random(seed))


def product_records(products: Catalogue) -> Iterator[Pair]:
    for sku, product in products.products.items():
        yield sku.encode(), orjson.dumps(product)


def item_events(count: int, stores: int = 1000, start: int = 0) -> Iterator[Pair]:
    """Store events in the demo generator's mix (80% sales, 15% restocks, 5% adjustments)
    over ``stores`` stores, timestamped now; cheap enough to write millions."""
    products = catalogue()
    skus = list(products.products)
    now_ms = int(time.time() * 1000)
    for n in range(start, start + count):
        store = f"store-{n * 7919 % stores:04d}"
        sku = skus[n * 31 % len(skus)]
        kind = n % 20
        head = f'{{"event_id":"e{n}","store_id":"{store}","sku":"{sku}","ts":{now_ms + n // 100},'
        if kind < 16:
            price = products.prices[sku]
            tail = f'"kind":"sale","quantity":{n % 5 + 1},"unit_price":{price}}}'
        elif kind < 19:
            tail = f'"kind":"restock","quantity":{20 + n % 80}}}'
        else:
            tail = f'"kind":"adjust","quantity":{(n % 5) - 2 or 1}}}'
        yield store.encode(), (head + tail).encode()


def counter_records(keys: int) -> Iterator[Pair]:
    """Changelog records of ``word_counts``: raw key bytes, the JSON count."""
    for n in range(keys):
        yield f"k{n:08d}".encode(), str(n % 1000 + 1).encode()


def counter_key(n: int) -> str:
    return f"k{n:08d}"
