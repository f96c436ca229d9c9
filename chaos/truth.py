"""Ground truth from the source topics: every table, and the settled pairs.

The rules are the contract's, written here again on purpose (not imported from
``core.semantics`` or the join), so that a rule the workers got wrong shows up. Each
topic partition is taken in offset order, which is all the truth may depend on: the
settling join's result must not depend on how the two topics' consumption interleaves.

Settling (``agents/settling.py``, ``tables/join.py``): a payment settles the sale whose
``event_id`` is its ``sale_event_id`` when ``sale.ts <= payment.ts <= sale.ts + 10 min``,
unless one of them arrived too late: each record's *watermark* is the largest ``ts`` its
own topic partition had shown up to and including it; the payment is too late when its
watermark is past ``sale.ts + 10 min`` (payments have no grace), the sale when its
watermark minus 10 minutes (sales' grace) is past ``payment.ts``. A sale that nothing
settled counts in ``unsettled_sales`` once both partitions' event time is past
``sale.ts + 10 min``.
"""

from __future__ import annotations

import bisect
import heapq
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

SEQ_HEADER = "chaos-seq"
WINDOW_MS = 10 * 60 * 1000
HOUR_MS = 3_600_000
MAX_BYTES = 64 * 1024
_NON_WORD = re.compile(r"\W+")


def words_of(line: str) -> list[str]:
    """The contract's tokens: ``re.split(r"\\W+", line.lower())`` without empty ones."""
    return [token for token in _NON_WORD.split(line.lower()) if token]


# -- sequence numbers ---------------------------------------------------------------


@dataclass
class SeqRuns:
    """The sequence numbers one topic partition holds, as runs where offset and seq both
    go up by one: [first offset, first seq, length]. A producer that loses nothing and
    duplicates nothing leaves one run per broken-off stretch, not one per record."""

    runs: list[list[int]] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)
    highest: int = -1
    out_of_sequence: int = 0

    def add(self, offset: int, seq: int) -> None:
        if seq <= self.highest:
            self.out_of_sequence += 1  # written twice, or out of order
        self.highest = max(self.highest, seq)
        last = self.runs[-1] if self.runs else None
        if last is not None and offset == last[0] + last[2] and seq == last[1] + last[2]:
            last[2] += 1
            return
        self.runs.append([offset, seq, 1])
        self.starts.append(offset)

    def holds(self, base_offset: int, first_seq: int, count: int) -> bool:
        """Whether offsets ``base_offset ..`` hold seqs ``first_seq ..``, ``count`` long."""
        index = bisect.bisect_right(self.starts, base_offset) - 1
        if index < 0:
            return False
        offset, seq, length = self.runs[index]
        inside = base_offset + count <= offset + length
        return inside and seq + (base_offset - offset) == first_seq


def record_seq(headers: Sequence[tuple[str, bytes]]) -> int | None:
    for name, value in headers:
        if name == SEQ_HEADER:
            return int(value)
    return None


# -- the catalogue ------------------------------------------------------------------


@dataclass
class Catalogue:
    """Every version of every product: (record timestamp, offset, category or None)."""

    versions: dict[str, list[tuple[int, int, str | None]]] = field(default_factory=dict)

    def add(self, key: bytes, timestamp: int, offset: int, value: bytes | None) -> None:
        sku = key.decode("utf-8")
        category = None if value is None else str(orjson.loads(value)["category"])
        versions = self.versions.setdefault(sku, [])
        versions.append((timestamp, offset, category))
        versions.sort(key=lambda v: (v[0], v[1]))

    def category_at(self, sku: str, ts: int) -> str:
        """The category of the latest version at or before ``ts``; "unknown" if none."""
        chosen = None
        for timestamp, _offset, category in self.versions.get(sku, ()):
            if timestamp > ts:
                break
            chosen = category
        return chosen if chosen is not None else "unknown"


# -- settling -----------------------------------------------------------------------


@dataclass
class _Sale:
    ts: int
    watermark: int
    store: str
    matched: bool = False


@dataclass
class _Payment:
    ts: int
    watermark: int
    payment_id: str


def settles(sale: _Sale, payment: _Payment) -> bool:
    """Whether a sale and a payment for it form a pair (see the module's docstring)."""
    inside = sale.ts <= payment.ts <= sale.ts + WINDOW_MS
    payment_late = payment.watermark > sale.ts + WINDOW_MS
    sale_late = sale.watermark - WINDOW_MS > payment.ts
    return inside and not payment_late and not sale_late


@dataclass
class PartitionSettling:
    """The settling of one partition. Records are kept only while a partner that could
    still pair with them may come (watermarks only grow), so memory stays bounded."""

    sales_time: int | None = None
    payments_time: int | None = None
    sales: dict[str, list[_Sale]] = field(default_factory=lambda: defaultdict(list))
    payments: dict[str, list[_Payment]] = field(default_factory=lambda: defaultdict(list))
    _sale_expiry: list[tuple[int, str]] = field(default_factory=list)
    _payment_expiry: list[tuple[int, str]] = field(default_factory=list)
    _unmatched: list[tuple[int, str]] = field(default_factory=list)

    def event(self, ts: int) -> None:
        """Any valid item event moves item-events' event time."""
        self.sales_time = ts if self.sales_time is None else max(self.sales_time, ts)

    def sale(self, event_id: str, store: str, ts: int, pairs: list[tuple[str, str]]) -> None:
        self.event(ts)
        assert self.sales_time is not None
        sale = _Sale(ts, self.sales_time, store)
        for payment in self.payments.get(event_id, ()):
            if settles(sale, payment):
                pairs.append((event_id, payment.payment_id))
                sale.matched = True
        self.sales[event_id].append(sale)
        heapq.heappush(self._sale_expiry, (ts, event_id))

    def payment(self, sale_id: str, payment_id: str, ts: int, pairs: list[tuple[str, str]]) -> None:
        self.payments_time = ts if self.payments_time is None else max(self.payments_time, ts)
        payment = _Payment(ts, self.payments_time, payment_id)
        for sale in self.sales.get(sale_id, ()):
            if settles(sale, payment):
                pairs.append((sale_id, payment_id))
                sale.matched = True
        self.payments[sale_id].append(payment)
        heapq.heappush(self._payment_expiry, (ts, sale_id))

    def expire(self, unsettled: Counter[str]) -> None:
        """Forget what no later record can pair with; count the unmatched sales whose
        window both topics' event time has passed."""
        paid = -1 if self.payments_time is None else self.payments_time
        sold = -1 if self.sales_time is None else self.sales_time
        # No later payment pairs with a sale once payments' event time passed its window.
        while self._sale_expiry and paid > self._sale_expiry[0][0] + WINDOW_MS:
            ts, event_id = heapq.heappop(self._sale_expiry)
            for sale in _pop_first(self.sales, event_id, ts):
                if not sale.matched:
                    heapq.heappush(self._unmatched, (sale.ts, sale.store))
        # No later sale pairs with a payment once sales' event time minus their grace
        # passed the payment.
        while self._payment_expiry and sold - WINDOW_MS > self._payment_expiry[0][0]:
            ts, sale_id = heapq.heappop(self._payment_expiry)
            _pop_first(self.payments, sale_id, ts)
        while self._unmatched and sold > self._unmatched[0][0] + WINDOW_MS:
            unsettled[heapq.heappop(self._unmatched)[1]] += 1


def _pop_first(index: dict[str, list[Any]], key: str, ts: int) -> list[Any]:
    """Remove the first record of ``index[key]`` at ``ts``; [it] or []."""
    records = index.get(key, [])
    for position, record in enumerate(records):
        if record.ts == ts:
            del records[position]
            if not records:
                del index[key]
            return [record]
    return []


# -- the truth ----------------------------------------------------------------------


@dataclass
class Truth:
    """The tables implied by what the source topics held, fed partition by partition."""

    catalogue: Catalogue = field(default_factory=Catalogue)
    lines: Counter[bytes] = field(default_factory=Counter)
    inventory: dict[str, dict[str, Any]] = field(default_factory=dict)
    sales: dict[tuple[str, int], list[Any]] = field(default_factory=dict)
    settling: dict[int, PartitionSettling] = field(default_factory=dict)
    unsettled: Counter[str] = field(default_factory=Counter)
    pairs: list[tuple[str, str]] = field(default_factory=list)
    runs: dict[tuple[str, int], SeqRuns] = field(default_factory=dict)
    counts: Counter[str] = field(default_factory=Counter)
    _tokens: dict[bytes, list[str]] = field(default_factory=dict)

    def add_lines(self, partition: int, records: Iterable[Any]) -> None:
        runs = self._runs("text-lines", partition)
        for record in records:
            self._track(runs, record)
            self.lines[record.value] += 1

    def add_events(self, partition: int, records: Iterable[Any]) -> None:
        runs = self._runs("item-events", partition)
        settling = self.settling.setdefault(partition, PartitionSettling())
        for record in records:
            self._track(runs, record)
            event = _valid(record.value, ("event_id", "store_id", "sku", "kind", "quantity", "ts"))
            if event is None:
                self.counts["invalid item-events"] += 1
                continue
            self._stock(event)
            if event["kind"] == "sale":
                self._sale(event)
                settling.sale(event["event_id"], event["store_id"], event["ts"], self.pairs)
            else:
                settling.event(event["ts"])
        settling.expire(self.unsettled)

    def add_payments(self, partition: int, records: Iterable[Any]) -> None:
        runs = self._runs("payments", partition)
        settling = self.settling.setdefault(partition, PartitionSettling())
        for record in records:
            self._track(runs, record)
            fields = ("payment_id", "sale_event_id", "store_id", "amount", "ts")
            payment = _valid(record.value, fields)
            if payment is None:
                self.counts["invalid payments"] += 1
                continue
            sale_id, payment_id = payment["sale_event_id"], payment["payment_id"]
            settling.payment(sale_id, payment_id, payment["ts"], self.pairs)
        settling.expire(self.unsettled)

    def add_products(self, partition: int, records: Iterable[Any]) -> None:
        for record in records:
            self.catalogue.add(record.key, record.timestamp, record.offset, record.value)

    def words(self) -> dict[bytes, int]:
        """word_counts: every valid line's tokens, counted."""
        counts: Counter[str] = Counter()
        for line, n in self.lines.items():
            for token in self._tokens_of(line):
                counts[token] += n
        return {word.encode("utf-8"): n for word, n in counts.items()}

    def _tokens_of(self, line: bytes | None) -> list[str]:
        if line is None:
            return []
        tokens = self._tokens.get(line)
        if tokens is None:
            try:
                text = line.decode("utf-8") if len(line) <= MAX_BYTES else None
            except UnicodeDecodeError:
                text = None
            tokens = self._tokens[line] = words_of(text) if text is not None else []
        return tokens

    def _stock(self, event: dict[str, Any]) -> None:
        store = self.inventory.get(event["store_id"])
        if store is None:
            store = self.inventory[event["store_id"]] = {
                "store_id": event["store_id"],
                "on_hand": {},
                "updated_at": event["ts"],
            }
        change = -event["quantity"] if event["kind"] == "sale" else event["quantity"]
        store["on_hand"][event["sku"]] = store["on_hand"].get(event["sku"], 0) + change
        store["updated_at"] = max(store["updated_at"], event["ts"])

    def _sale(self, event: dict[str, Any]) -> None:
        category = self.catalogue.category_at(event["sku"], event["ts"])
        window = (category, event["ts"] - event["ts"] % HOUR_MS)
        total = self.sales.setdefault(window, [0, 0.0])
        total[0] += event["quantity"]
        total[1] += event["quantity"] * event["unit_price"]

    def _runs(self, topic: str, partition: int) -> SeqRuns:
        return self.runs.setdefault((topic, partition), SeqRuns())

    def _track(self, runs: SeqRuns, record: Any) -> None:
        self.counts["records"] += 1
        seq = record_seq(record.headers)
        if seq is not None:
            runs.add(record.offset, seq)


def _valid(raw: bytes | None, required: tuple[str, ...]) -> dict[str, Any] | None:
    """The record as a dict when it is JSON with every required field, else None."""
    if raw is None or len(raw) > MAX_BYTES:
        return None
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(value, dict) or any(name not in value for name in required):
        return None
    return value
