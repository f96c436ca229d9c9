"""The tables as their changelogs hold them, and how they differ from the ground truth.

Each table is the latest value per key of ``streamstate-<table>-changelog`` (read
committed, so an aborted transaction never shows), read incrementally; ``settled-sales``
is read as a multiset of (sale, payment) pairs. A difference is split into *over* (an
effect applied more often than its record occurs: what at_least_once may do after a
crash) and *under* (an effect missing: what no guarantee allows).

Over and under are per key, so within a key fed by many records a lost effect and a
repeated one cancel out: under at_least_once, which repeats effects after a crash, a loss
could hide there. The *traced* keys (chaos/workload.py) are fed by one record each, so
nothing can make up for a loss there: each must hold at least its record's effect, and
one that does not counts in ``traced_lost``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from chaos.reader import TopicReader
from chaos.truth import Truth
from chaos.workload import ADJUST_UP_SKUS, RESTOCK_SKUS, is_traced_sku, is_traced_word
from core.topics import POSITION_KEY

TABLES = ("word_counts", "inventory", "sales_by_category", "unsettled_sales")


class TableCopy:
    """The latest value of every key of one table, from its changelog."""

    def __init__(self, bootstrap: str, table: str) -> None:
        self.reader = TopicReader(bootstrap, f"streamstate-{table}-changelog")
        self.state: dict[bytes, Any] = {}

    def refresh(self) -> None:
        self.reader.read_new(self._apply)

    def _apply(self, partition: int, records: Sequence[Any]) -> None:
        for record in records:
            if record.key == POSITION_KEY:
                continue  # the engine's record of its source offsets, not a table key
            if record.value is None:
                self.state.pop(record.key, None)
            else:
                self.state[record.key] = orjson.loads(record.value)


class SettledCopy:
    """Every (sale event id, payment id) pair ``settled-sales`` holds, with repeats."""

    def __init__(self, bootstrap: str) -> None:
        self.reader = TopicReader(bootstrap, "settled-sales")
        self.pairs: Counter[tuple[str, str]] = Counter()
        self.wrong_key = 0

    def refresh(self) -> None:
        self.reader.read_new(self._apply)

    def _apply(self, partition: int, records: Sequence[Any]) -> None:
        for record in records:
            pair = orjson.loads(record.value)
            sale, payment = pair["sale"], pair["payment"]
            self.pairs[(sale["event_id"], payment["payment_id"])] += 1
            if record.key != sale["store_id"].encode():
                self.wrong_key += 1


@dataclass
class Tables:
    """The four tables and the settled pairs, refreshed together."""

    bootstrap: str
    copies: dict[str, TableCopy] = field(init=False)
    settled: SettledCopy = field(init=False)

    def __post_init__(self) -> None:
        self.copies = {name: TableCopy(self.bootstrap, name) for name in TABLES}
        self.settled = SettledCopy(self.bootstrap)

    def refresh(self) -> None:
        for copy in self.copies.values():
            copy.refresh()
        self.settled.refresh()

    def state(self, table: str) -> dict[bytes, Any]:
        return self.copies[table].state


@dataclass(frozen=True)
class TableDrift:
    """How one table differs: units over and under, keys wrong, a few examples; how many
    keys the truth holds; of the traced keys, how many there are and how many hold less
    than their one record; and which keys are wrong (words, stores, (category, window
    start) or (sale, payment) pairs)."""

    over: float = 0
    under: float = 0
    keys_wrong: int = 0
    examples: tuple[str, ...] = ()
    keys_expected: int = 0
    traced: int = 0
    traced_lost: int = 0
    wrong_keys: frozenset[Any] = frozenset()

    @property
    def exact(self) -> bool:
        return self.keys_wrong == 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "over": self.over,
            "under": self.under,
            "keys_wrong": self.keys_wrong,
            "keys_expected": self.keys_expected,
            "traced": self.traced,
            "traced_lost": self.traced_lost,
            "examples": list(self.examples),
        }


@dataclass(frozen=True)
class Drift:
    """Every table's drift; ``exact`` when nothing differs anywhere."""

    tables: dict[str, TableDrift]

    @property
    def exact(self) -> bool:
        return all(t.exact for t in self.tables.values())

    @property
    def under(self) -> float:
        return sum(t.under for t in self.tables.values())

    def as_dict(self) -> dict[str, Any]:
        return {"exact": self.exact, **{n: t.as_dict() for n, t in self.tables.items()}}


class TableStates(Protocol):
    """What a comparison reads of the tables (:class:`Tables`, or a stand-in in tests)."""

    settled: SettledCopy

    def state(self, table: str) -> dict[bytes, Any]: ...


def drift(truth: Truth, tables: TableStates) -> Drift:
    """Compare every table and the settled pairs with the truth."""
    return Drift(
        {
            "word_counts": _counts(
                truth.words(), tables.state("word_counts"), traced=is_traced_word
            ),
            "inventory": _inventory(truth.inventory, tables.state("inventory")),
            "sales_by_category": _sales(truth.sales, tables.state("sales_by_category")),
            "unsettled_sales": _counts(
                {k.encode(): v for k, v in truth.unsettled.items()}, tables.state("unsettled_sales")
            ),
            "settled-sales": _pairs(Counter(truth.pairs), tables.settled),
        }
    )


def _counts(
    want: dict[bytes, int], got: dict[bytes, Any], traced: Callable[[str], bool] | None = None
) -> TableDrift:
    over = under = 0
    wrong: set[str] = set()
    examples = []
    for key in set(want) | set(got):
        diff = int(got.get(key, 0)) - int(want.get(key, 0))
        if diff:
            wrong.add(key.decode(errors="replace"))
            over, under = over + max(diff, 0), under + max(-diff, 0)
            examples.append(f"{key.decode(errors='replace')}: {got.get(key)} for {want.get(key)}")
    followed = [k for k in want if traced is not None and traced(k.decode(errors="replace"))]
    lost = sum(1 for k in followed if int(got.get(k, 0)) < want[k])
    return _drift(over, under, wrong, examples, len(want), len(followed), lost)


def _drift(
    over: float,
    under: float,
    wrong: set[Any],
    examples: list[str],
    expected: int,
    traced: int = 0,
    lost: int = 0,
) -> TableDrift:
    return TableDrift(
        over,
        under,
        len(wrong),
        tuple(sorted(examples)[:3]),
        expected,
        traced,
        lost,
        frozenset(wrong),
    )


def _direction(sku: str) -> int:
    """+1 for skus whose stock only grows (restocks, upward adjustments), else -1."""
    grows = sku in RESTOCK_SKUS or sku in ADJUST_UP_SKUS or is_traced_sku(sku)
    return 1 if grows else -1


def _inventory(want: dict[str, dict[str, Any]], got: dict[bytes, Any]) -> TableDrift:
    over = under = traced = lost = 0
    wrong: set[str] = set()
    examples = []
    for store in {s.encode() for s in want} | set(got):
        expected, actual = want.get(store.decode()), got.get(store)
        mine = (actual or {}).get("on_hand", {})
        theirs = (expected or {}).get("on_hand", {})
        for sku in filter(is_traced_sku, theirs):
            traced += 1
            lost += (mine.get(sku, 0) - theirs[sku]) * _direction(sku) < 0
        if expected == actual:
            continue
        wrong.add(store.decode())
        examples.append(f"{store.decode()}: {actual} for {expected}")
        for sku in set(mine) | set(theirs):
            moved = (mine.get(sku, 0) - theirs.get(sku, 0)) * _direction(sku)
            over, under = over + max(moved, 0), under + max(-moved, 0)
        if (actual or {}).get("updated_at", 0) < (expected or {}).get("updated_at", 0):
            under += 1  # the latest event is missing
    return _drift(over, under, wrong, examples, len(want), traced, lost)


def _sales(want: dict[tuple[str, int], list[Any]], got: dict[bytes, Any]) -> TableDrift:
    windows: dict[tuple[str, int], Any] = {}
    for key, value in got.items():
        name, (start_s, _end_s) = orjson.loads(key)
        windows[(name, round(float(start_s) * 1000))] = value
    over = under = 0
    wrong: set[tuple[str, int]] = set()
    examples = []
    for window in set(want) | set(windows):
        units, revenue = want.get(window, (0, 0.0))
        actual = windows.get(window) or {"units": 0, "revenue": 0.0}
        diff = int(actual["units"]) - units
        if diff or float(actual["revenue"]) != revenue:
            wrong.add(window)
            over, under = over + max(diff, 0), under + max(-diff, 0)
            examples.append(f"{window}: {actual} for units {units}, revenue {revenue}")
    return _drift(over, under, wrong, examples, len(want))


def _pairs(want: Counter[tuple[str, str]], settled: SettledCopy) -> TableDrift:
    got = settled.pairs
    missing = sum(1 for pair in want if pair not in got)
    repeated = sum(n - 1 for n in got.values() if n > 1)
    unexpected = [pair for pair in got if pair not in want]
    examples = [f"missing {p}" for p in list(set(want) - set(got))[:2]]
    examples += [f"unexpected {p}" for p in unexpected[:2]]
    examples += [f"repeated {p} x{n}" for p, n in got.items() if n > 1][:2]
    wrong = missing + repeated + len(unexpected) + settled.wrong_key
    # Each pair is one sale and one payment: a missing pair is a record's effect lost.
    wrong_pairs = {p for p in want if p not in got} | {p for p, n in got.items() if n != want[p]}
    return TableDrift(
        repeated + len(unexpected),
        missing,
        wrong,
        tuple(examples),
        len(want),
        len(want),
        missing,
        frozenset(wrong_pairs),
    )
