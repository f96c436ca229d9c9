"""Ground truth computed from what the source topics hold, and the tables to compare.

The expected tables follow the contract's rules, written here again on purpose (not
imported from ``core.semantics``), so that a rule the workers got wrong shows up.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from chaos.load import SEQ_HEADER
from tests.support.kafka_io import Record, changelog_state, read_topic

State = dict[bytes, Any]


def expected_words(lines: list[bytes]) -> State:
    counts: Counter[str] = Counter()
    for raw in lines:
        counts.update(t for t in re.split(r"\W+", raw.decode("utf-8").lower()) if t)
    return {word.encode(): n for word, n in counts.items()}


def expected_inventory(events: list[dict[str, Any]]) -> State:
    stores: dict[str, dict[str, Any]] = {}
    for e in events:
        store = stores.setdefault(e["store_id"], {"store_id": e["store_id"], "on_hand": {}})
        delta = -e["quantity"] if e["kind"] == "sale" else e["quantity"]
        store["on_hand"][e["sku"]] = store["on_hand"].get(e["sku"], 0) + delta
        store["updated_at"] = max(store.get("updated_at", 0), e["ts"])
    return {k.encode(): v for k, v in stores.items()}


@dataclass(frozen=True)
class Truth:
    """What the source topics hold now, and the tables it implies."""

    lines: int
    events: int
    seqs: frozenset[int]
    words: State
    inventory: State

    @property
    def words_total(self) -> int:
        return sum(int(v) for v in self.words.values())


def _seq(record: Record) -> int | None:
    raw = record.headers.get(SEQ_HEADER)
    return int(raw) if raw is not None else None


def read_truth(bootstrap: str) -> Truth:
    """Ground truth from every record of text-lines and item-events."""
    lines = read_topic(bootstrap, "text-lines", 30)
    events = read_topic(bootstrap, "item-events", 30)
    seqs = {s for s in map(_seq, lines + events) if s is not None}
    parsed = [orjson.loads(r.value) for r in events if r.value is not None]
    return Truth(
        lines=len(lines),
        events=len(events),
        seqs=frozenset(seqs),
        words=expected_words([r.value for r in lines if r.value is not None]),
        inventory=expected_inventory(parsed),
    )


@dataclass(frozen=True)
class Tables:
    """The latest value of every key of the compared tables, from their changelogs."""

    words: State
    inventory: State

    @property
    def words_total(self) -> int:
        return sum(int(v) for v in self.words.values())


def read_tables(bootstrap: str) -> Tables:
    return Tables(
        words=changelog_state(bootstrap, "word_counts"),
        inventory=changelog_state(bootstrap, "inventory"),
    )


@dataclass(frozen=True)
class Drift:
    """How the tables differ from the ground truth."""

    words_produced: int
    words_counted: int
    words_over: int
    words_under: int
    keys_over: int
    keys_under: int
    stores_wrong: int

    @property
    def exact(self) -> bool:
        return self.words_over == 0 and self.words_under == 0 and self.stores_wrong == 0

    def as_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "exact": self.exact}


def drift(truth: Truth, tables: Tables) -> Drift:
    over = under = keys_over = keys_under = 0
    for word in set(truth.words) | set(tables.words):
        diff = int(tables.words.get(word, 0)) - int(truth.words.get(word, 0))
        if diff > 0:
            over, keys_over = over + diff, keys_over + 1
        elif diff < 0:
            under, keys_under = under - diff, keys_under + 1
    stores = set(truth.inventory) | set(tables.inventory)
    wrong = sum(1 for s in stores if truth.inventory.get(s) != tables.inventory.get(s))
    return Drift(
        words_produced=truth.words_total,
        words_counted=tables.words_total,
        words_over=over,
        words_under=under,
        keys_over=keys_over,
        keys_under=keys_under,
        stores_wrong=wrong,
    )


def settle(
    bootstrap: str, timeout: float = 180.0, quiet_s: float = 12.0
) -> tuple[Truth, Tables, float]:
    """Wait until the tables equal the ground truth, or stop changing for ``quiet_s``.

    Returns the truth, the tables and the seconds it took (the catch-up time).
    """
    truth = read_truth(bootstrap)
    started = time.monotonic()
    last: Tables | None = None
    last_change = started
    while True:
        tables = read_tables(bootstrap)
        now = time.monotonic()
        if tables.words == truth.words and tables.inventory == truth.inventory:
            return truth, tables, now - started
        if last is None or tables != last:
            last, last_change = tables, now
        elif now - last_change >= (quiet_s if _all_seen(truth, tables) else 3 * quiet_s):
            # Stable: longer when some words are still missing (a slow restore).
            return truth, tables, last_change - started
        if now - started > timeout:
            return truth, tables, now - started
        time.sleep(2.0)


def _all_seen(truth: Truth, tables: Tables) -> bool:
    """Every word produced is counted at least once (so processing reached the end)."""
    return all(tables.words.get(w, 0) >= n for w, n in truth.words.items())


def wait_for(check: Callable[[], Any], timeout: float, interval: float = 0.5) -> Any:
    """Poll ``check`` until it returns something truthy; None on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(interval)
    return None
