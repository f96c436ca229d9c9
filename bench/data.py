"""Deterministic benchmark data: text lines, store events, changelog records."""

from __future__ import annotations

import random
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import orjson

from bench.kafka import Pair, Stamped
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


def recategorised(products: Catalogue, every: int = 10) -> Iterator[Pair]:
    """A second version of every ``every``-th product, in the next category: written with
    a later timestamp, it changes the category of that product's later sales."""
    categories = sorted({p["category"] for p in products.products.values()})
    for index, (sku, product) in enumerate(sorted(products.products.items())):
        if index % every == 0:
            after = categories[(categories.index(product["category"]) + 1) % len(categories)]
            yield sku.encode(), orjson.dumps({**product, "category": after})


@dataclass(frozen=True)
class EventTime:
    """Event times spread evenly: event ``n`` of ``count`` at ``start_ms + n * span_ms / count``."""

    start_ms: int
    span_ms: int
    count: int

    def of(self, n: int) -> int:
        return self.start_ms + n * self.span_ms // self.count


def _store_event(n: int, stores: int, skus: list[str], unknown_every: int) -> tuple[str, str, int]:
    """(store, sku, kind selector) of event ``n``: kind < 16 sale, < 19 restock, else adjust."""
    store = f"store-{n * 7919 % stores:04d}"
    if unknown_every and n % unknown_every == unknown_every - 1:
        sku = f"XXX-{n % 13:04d}"  # in no catalogue: counted under "unknown"
    else:
        sku = skus[n * 31 % len(skus)]
    return store, sku, n % 20


def item_events(
    count: int,
    stores: int = 1000,
    start: int = 0,
    *,
    clock: EventTime | None = None,
    unknown_every: int = 0,
) -> Iterator[Pair]:
    """Store events in the demo generator's mix (80% sales, 15% restocks, 5% adjustments)
    over ``stores`` stores; cheap enough to write millions.

    Timestamped now (a millisecond per hundred events) or by ``clock``; with
    ``unknown_every``, every so many events name a sku that no catalogue holds.
    """
    products = catalogue()
    skus = list(products.products)
    now_ms = int(time.time() * 1000)
    for n in range(start, start + count):
        store, sku, kind = _store_event(n, stores, skus, unknown_every)
        ts = now_ms + n // 100 if clock is None else clock.of(n - start)
        head = f'{{"event_id":"e{n}","store_id":"{store}","sku":"{sku}","ts":{ts},'
        if kind < 16:
            price = products.prices.get(sku, 1.0)
            tail = f'"kind":"sale","quantity":{n % 5 + 1},"unit_price":{price}}}'
        elif kind < 19:
            tail = f'"kind":"restock","quantity":{20 + n % 80}}}'
        else:
            tail = f'"kind":"adjust","quantity":{(n % 5) - 2 or 1}}}'
        yield store.encode(), (head + tail).encode()


#: A paid sale's payment comes this long after it: within the 10-minute window four
#: times in five, 11 to 15 minutes after it (too late to settle it) otherwise.
SETTLE_WINDOW_MS = 10 * 60 * 1000


def payment_delay_ms(n: int) -> int:
    if n % 10 == 8:
        return SETTLE_WINDOW_MS + 60_000 * (1 + n % 5)
    return n * 7919 % (SETTLE_WINDOW_MS + 1)


def payments(
    count: int, clock: EventTime, stores: int = 1000, start: int = 0, unknown_every: int = 0
) -> list[Pair]:
    """Payments for every other sale of :func:`item_events` with the same arguments, in
    the order of their ``ts`` (as they would arrive); see :func:`payment_delay_ms`."""
    products = catalogue()
    skus = list(products.products)
    made: list[tuple[int, Pair]] = []
    for n in range(start, start + count):
        store, sku, kind = _store_event(n, stores, skus, unknown_every)
        if kind >= 16 or n % 2:
            continue
        ts = clock.of(n - start) + payment_delay_ms(n)
        amount = round((n % 5 + 1) * products.prices.get(sku, 1.0), 2)
        value = (
            f'{{"payment_id":"p{n}","sale_event_id":"e{n}","store_id":"{store}",'
            f'"amount":{amount},"ts":{ts}}}'
        )
        made.append((ts, (store.encode(), value.encode())))
    made.sort(key=lambda item: item[0])
    return [pair for _, pair in made]


def at_event_time(records: Iterable[Pair]) -> Iterator[Stamped]:
    """JSON records timestamped with their ``ts``, as a producer that stamps each record
    with the time of its event would write them."""
    for key, value in records:
        yield key, value, int(orjson.loads(value)["ts"])


def counter_records(keys: int) -> Iterator[Pair]:
    """Changelog records of ``word_counts``: raw key bytes, the JSON count."""
    for n in range(keys):
        yield f"k{n:08d}".encode(), str(n % 1000 + 1).encode()


def counter_key(n: int) -> str:
    return f"k{n:08d}"
