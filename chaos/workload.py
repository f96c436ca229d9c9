"""What the chaos load writes: text lines, item events, payments and the product catalogue.

Deterministic for a seed, and cheap per record, so that one process can offer tens of
thousands of records a second. Records are generated with their partition (murmur2 of the
key for keyed topics, as Kafka's default partitioner), so the producer can write whole
record batches per partition.

The data is shaped so that a wrong table tells what went wrong:

- each sku moves one way only (sold, restocked, adjusted up or adjusted down), so an
  on-hand figure above or below the truth tells a repeated event from a lost one;
- one text line in ``TRACE_LINE_EVERY`` carries a word of its own and one item event in
  ``TRACE_EVENT_EVERY`` restocks a sku of its own: keys fed by one record each, which a
  duplicate of another record cannot make up for, so a lost record shows even where
  at_least_once duplicates others into the keys it shares with them;
- prices are dyadic (multiples of 0.25), so revenue sums are exact in any order;
- event time is a synthetic clock faster than real time, so hourly windows roll and sales
  pass their 10-minute settling window within a run; a few sales arrive late, a few
  payments arrive after their topic's event time moved on, a few land on the window's
  bounds, and some come after the window: the join's rules all get exercised.
"""

from __future__ import annotations

import heapq
import random
import time
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiokafka.partitioner import murmur2

PARTITIONS = 8
SETTLE_WINDOW_MS = 10 * 60 * 1000
MINUTE_MS = 60_000

CATEGORIES = ("dairy", "bakery", "drinks", "produce", "frozen", "household")
#: sku -> unit price (a multiple of 0.25); the catalogue names every sku here, four per
#: category in CATEGORIES' order, and none of the UNKNOWN ones.
SALE_SKUS = {
    f"{category[:3].upper()}-{n}": 0.25 * (1 + (index * 4 + n) % 15)
    for index, category in enumerate(CATEGORIES)
    for n in range(1, 5)
}
UNKNOWN_SKUS = {"NOP-1": 1.5, "NOP-2": 0.75, "NOP-3": 2.25}
RESTOCK_SKUS = ("RST-1", "RST-2", "RST-3")
ADJUST_UP_SKUS = ("ADU-1", "ADU-2")
ADJUST_DOWN_SKUS = ("ADD-1", "ADD-2")
#: Skus whose category changes during a run: a second catalogue version, timestamped
#: this long after the clock's start, moves each to the next category.
RECATEGORISED = {"DAI-1": 20 * MINUTE_MS, "BAK-2": 35 * MINUTE_MS}
STORES = tuple(f"store-{n:02d}" for n in range(48))
#: Every so many lines and item events one is traced (17 and 67 are prime to the
#: partition count, so the traced records spread over every partition).
TRACE_LINE_EVERY = 17
TRACE_EVENT_EVERY = 67
#: Traced words and skus begin so; no other word holds a digit, no other sku this prefix.
TRACED_WORD_PREFIX = "t0"
TRACED_SKU_PREFIX = "TRC-"
UNICODE_WORDS = ("straße", "café", "naïve", "ΣΟΦΙΑ", "élan", "über", "Ærø", "日本")


def partition_of(key: bytes, partitions: int = PARTITIONS) -> int:
    """Kafka's default partition of a key (murmur2, as the Java client)."""
    hashed: int = murmur2(key)
    return (hashed & 0x7FFFFFFF) % partitions


def traced_word(run_id: str, n: int) -> str:
    """The word that only line ``n`` of a run holds."""
    return f"{TRACED_WORD_PREFIX}{run_id.lower()}n{n}"


def is_traced_word(word: str) -> bool:
    return word.startswith(TRACED_WORD_PREFIX)


def traced_sku(run_id: str, n: int) -> str:
    """The sku that only item event ``n`` of a run restocks."""
    return f"{TRACED_SKU_PREFIX}{run_id}-{n}"


def is_traced_sku(sku: str) -> bool:
    return sku.startswith(TRACED_SKU_PREFIX)


def vocabulary(rng: random.Random, size: int = 3000) -> list[str]:
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = {"".join(rng.choices(letters, k=rng.randint(2, 9))) for _ in range(size * 2)}
    return sorted(words)[:size]


def line_pool(seed: int, size: int = 8192, words_per_line: int = 10) -> list[bytes]:
    """Distinct-enough text lines of ten words; one in fifty mixes in non-ASCII words,
    some with punctuation and capitals (the tokeniser lower-cases and splits on \\W+)."""
    rng = random.Random(seed)
    words = vocabulary(rng)
    pool = []
    for n in range(size):
        picked = rng.choices(words, k=words_per_line)
        if n % 50 == 49:
            picked[::3] = [rng.choice(UNICODE_WORDS) for _ in picked[::3]]
        if n % 7 == 3:
            picked[0] = picked[0].capitalize() + ","
        pool.append(" ".join(picked).encode())
    return pool


def product_records(clock_start_ms: int) -> list[tuple[bytes, bytes, int]]:
    """The catalogue as (key, value, record timestamp): every sale sku but the unknown
    ones, before any sale; then the second versions of the recategorised skus."""
    before = clock_start_ms - 24 * 3_600_000
    records = []
    for sku in SALE_SKUS:
        category = CATEGORIES[list(SALE_SKUS).index(sku) // 4]
        product = {"sku": sku, "name": f"product {sku.lower()}", "category": category}
        records.append((sku.encode(), orjson.dumps(product), before))
    for sku, after_ms in RECATEGORISED.items():
        old = CATEGORIES[list(SALE_SKUS).index(sku) // 4]
        new = CATEGORIES[(CATEGORIES.index(old) + 1) % len(CATEGORIES)]
        product = {"sku": sku, "name": f"product {sku.lower()}", "category": new}
        records.append((sku.encode(), orjson.dumps(product), clock_start_ms + after_ms))
    return records


@dataclass
class Clock:
    """Synthetic event time: ``speed`` times faster than the load's active time, from
    ``start_ms``, never more than ``max_ahead_ms`` past the wall clock."""

    start_ms: int
    speed: float
    max_ahead_ms: int = 2 * MINUTE_MS

    def at(self, active_s: float) -> int:
        synthetic = self.start_ms + int(active_s * self.speed * 1000)
        return min(synthetic, int(time.time() * 1000) + self.max_ahead_ms)


@dataclass(frozen=True)
class Record:
    key: bytes | None
    value: bytes
    partition: int


@dataclass(order=True)
class _Due:
    at_ms: int
    n: int
    record: Record = field(compare=False)


class Workload:
    """Generates the records of one load process; ``run_id`` keeps ids unique per run."""

    def __init__(self, seed: int, run_id: str) -> None:
        self.rng = random.Random(seed)
        self.run_id = run_id
        self.lines = line_pool(seed)
        self.store_partitions = {s: partition_of(s.encode()) for s in STORES}
        self._line = 0
        self._event = 0
        self._payment = 0
        self._due: list[_Due] = []
        self._sale_skus = list(SALE_SKUS) * 6 + list(UNKNOWN_SKUS)

    def next_lines(self, count: int) -> list[Record]:
        """``count`` lines, round-robin over the partitions; every ``TRACE_LINE_EVERY``-th
        with a traced word of its own."""
        out = []
        for _ in range(count):
            n = self._line
            self._line += 1
            line = self.lines[n * 7919 % len(self.lines)]
            if n % TRACE_LINE_EVERY == 0:
                line += b" " + traced_word(self.run_id, n).encode()
            out.append(Record(None, line, n % PARTITIONS))
        return out

    def next_events(self, count: int, now_ms: int) -> list[Record]:
        """``count`` item events at event time ``now_ms``; schedules the payments of about
        half of the sales."""
        return [self._event_record(now_ms) for _ in range(count)]

    def due_payments(self, now_ms: int) -> list[Record]:
        """The payments whose time of arrival has come."""
        out = []
        while self._due and self._due[0].at_ms <= now_ms:
            out.append(heapq.heappop(self._due).record)
        return out

    @property
    def pending_payments(self) -> int:
        return len(self._due)

    def _event_record(self, now_ms: int) -> Record:
        n = self._event
        self._event += 1
        store = STORES[self.rng.randrange(len(STORES))]
        roll = self.rng.random()
        event: dict[str, Any] = {"event_id": f"{self.run_id}-e{n}", "store_id": store}
        if n % TRACE_EVENT_EVERY == 0:
            sku = traced_sku(self.run_id, n)
            event.update(sku=sku, kind="restock", quantity=self.rng.randint(1, 40), ts=now_ms)
        elif roll < 0.70:
            event.update(self._sale(now_ms))
        elif roll < 0.85:
            sku = RESTOCK_SKUS[n % len(RESTOCK_SKUS)]
            event.update(sku=sku, kind="restock", quantity=self.rng.randint(1, 40), ts=now_ms)
        elif roll < 0.925:
            sku = ADJUST_UP_SKUS[n % len(ADJUST_UP_SKUS)]
            event.update(sku=sku, kind="adjust", quantity=self.rng.randint(1, 5), ts=now_ms)
        else:
            sku = ADJUST_DOWN_SKUS[n % len(ADJUST_DOWN_SKUS)]
            event.update(sku=sku, kind="adjust", quantity=-self.rng.randint(1, 5), ts=now_ms)
        record = Record(store.encode(), orjson.dumps(event), self.store_partitions[store])
        if event["kind"] == "sale" and self.rng.random() < 0.5:
            self._schedule_payment(event, now_ms)
        return record

    def _sale(self, now_ms: int) -> dict[str, Any]:
        sku = self._sale_skus[self.rng.randrange(len(self._sale_skus))]
        price = SALE_SKUS.get(sku) or UNKNOWN_SKUS[sku]
        # One sale in thirty arrives late: up to 12 minutes behind its topic's event time
        # (sales have 10 minutes of grace, so some are beyond it).
        late = self.rng.random() < 1 / 30
        ts = now_ms - self.rng.randint(MINUTE_MS, 12 * MINUTE_MS) if late else now_ms
        quantity = self.rng.randint(1, 9)
        return {"sku": sku, "kind": "sale", "quantity": quantity, "unit_price": price, "ts": ts}

    def _schedule_payment(self, sale: dict[str, Any], now_ms: int) -> None:
        n = self._payment
        self._payment += 1
        roll = self.rng.random()
        if roll < 0.03:
            delay = 0  # on the window's first millisecond
        elif roll < 0.06:
            delay = SETTLE_WINDOW_MS  # on its last
        elif roll < 0.78:
            delay = self.rng.randint(1, SETTLE_WINDOW_MS - 1)
        else:
            delay = SETTLE_WINDOW_MS + self.rng.randint(1, 5 * MINUTE_MS)  # too late
        ts = sale["ts"] + delay
        # Most payments arrive when event time reaches them; one in twenty arrives up to
        # four minutes after payments' event time has passed it.
        lag = self.rng.randint(MINUTE_MS, 4 * MINUTE_MS) if self.rng.random() < 0.05 else 0
        payment = {
            "payment_id": f"{self.run_id}-p{n}",
            "sale_event_id": sale["event_id"],
            "store_id": sale["store_id"],
            "amount": sale["quantity"] * sale["unit_price"],
            "ts": ts,
        }
        store = sale["store_id"]
        record = Record(store.encode(), orjson.dumps(payment), self.store_partitions[store])
        heapq.heappush(self._due, _Due(max(ts + lag, now_ms), n, record))
