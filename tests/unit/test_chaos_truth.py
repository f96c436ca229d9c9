"""The chaos suite's ground truth and comparison, on small crafted inputs (no broker)."""

from __future__ import annotations

import itertools
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest

from chaos import checks
from chaos.compare import SettledCopy, TableDrift, drift
from chaos.truth import WINDOW_MS, Catalogue, SeqRuns, Truth, words_of

MINUTE = 60_000
T0 = 1_750_000_000_000 - 1_750_000_000_000 % 3_600_000  # the start of an hour


@dataclass
class Rec:
    """A consumer record as the truth reads one."""

    value: bytes | None
    offset: int
    key: bytes | None = None
    timestamp: int = 0
    headers: tuple[tuple[str, bytes], ...] = ()


@dataclass
class Feed:
    """Records of one partition of item-events and payments, with their offsets."""

    events: list[Rec] = field(default_factory=list)
    payments: list[Rec] = field(default_factory=list)

    def sale(self, event_id: str, ts: int, store: str = "s1", sku: str = "A-1") -> Feed:
        event = {"event_id": event_id, "store_id": store, "sku": sku, "kind": "sale"}
        event.update(quantity=2, unit_price=1.25, ts=ts)
        self.events.append(Rec(orjson.dumps(event), len(self.events)))
        return self

    def restock(self, ts: int, store: str = "s1") -> Feed:
        event = {"event_id": f"r{ts}", "store_id": store, "sku": "R-1", "kind": "restock"}
        event.update(quantity=5, ts=ts)
        self.events.append(Rec(orjson.dumps(event), len(self.events)))
        return self

    def payment(self, payment_id: str, sale_id: str, ts: int, store: str = "s1") -> Feed:
        payment = {"payment_id": payment_id, "sale_event_id": sale_id, "store_id": store}
        payment.update(amount=2.5, ts=ts)
        self.payments.append(Rec(orjson.dumps(payment), len(self.payments)))
        return self


def settle(feed: Feed, chunk: int = 1000, events_first: bool = True) -> Truth:
    """Feed both topics in chunks of ``chunk`` records, alternating between them."""
    truth = Truth()
    events = [feed.events[i : i + chunk] for i in range(0, len(feed.events), chunk)]
    payments = [feed.payments[i : i + chunk] for i in range(0, len(feed.payments), chunk)]
    pairs = list(itertools.zip_longest(events, payments, fillvalue=[]))
    for sales, paid in pairs:
        if events_first:
            truth.add_events(0, sales)
            truth.add_payments(0, paid)
        else:
            truth.add_payments(0, paid)
            truth.add_events(0, sales)
    return truth


def test_tokens_are_the_contracts_split_on_non_word_characters_lower_cased() -> None:
    assert words_of("Don't panic: user_42, Straße ΣΟΦΙΑ!") == [
        "don",
        "t",
        "panic",
        "user_42",
        "straße",
        "σοφια",
    ]


def test_a_payment_on_either_bound_of_the_window_settles_its_sale() -> None:
    feed = Feed().sale("e1", T0).sale("e2", T0).payment("p1", "e1", T0)
    feed.payment("p2", "e2", T0 + WINDOW_MS)
    assert settle(feed).pairs == [("e1", "p1"), ("e2", "p2")]


def test_a_payment_after_the_window_settles_nothing_and_the_sale_counts_once_both_times_pass() -> (
    None
):
    feed = Feed().sale("e1", T0).payment("p1", "e1", T0 + WINDOW_MS + 1)
    truth = settle(feed)
    assert truth.pairs == []
    assert truth.unsettled == Counter()  # item-events' event time has not passed it yet
    feed.restock(T0 + WINDOW_MS + 1)
    assert settle(feed).unsettled == Counter({"s1": 1})


def test_a_payment_arriving_after_payments_event_time_passed_the_window_is_too_late() -> None:
    feed = Feed().sale("e1", T0).sale("e2", T0)
    feed.payment("p2", "e2", T0 + WINDOW_MS + 1)  # moves payments' event time past e1
    feed.payment("p1", "e1", T0 + 5 * MINUTE)  # inside e1's window, but late
    truth = settle(feed)
    assert truth.pairs == []


def test_a_sale_arriving_beyond_its_grace_misses_earlier_payments() -> None:
    feed = Feed().restock(T0 + 25 * MINUTE)  # item-events' event time far ahead
    feed.sale("late", T0)  # 25 minutes behind: more than the 10 minutes of grace
    feed.sale("in-grace", T0 + 20 * MINUTE)  # 5 minutes behind: within the grace
    feed.payment("p1", "late", T0 + MINUTE).payment("p2", "in-grace", T0 + 21 * MINUTE)
    assert settle(feed).pairs == [("in-grace", "p2")]


def test_the_pairs_do_not_depend_on_how_the_two_topics_interleave() -> None:
    rng = random.Random(3)
    feed = Feed()
    for n in range(300):
        ts = T0 + n * 10_000
        feed.sale(f"e{n}", ts - rng.choice([0, 0, 0, 4 * MINUTE, 13 * MINUTE]))
        if n % 2 == 0:
            delay = rng.choice([0, WINDOW_MS, rng.randrange(WINDOW_MS), WINDOW_MS + MINUTE])
            feed.payment(f"p{n}", f"e{n}", ts + delay)
    feed.payments.sort(key=lambda r: orjson.loads(r.value or b"{}")["ts"] + rng.randrange(MINUTE))
    feed.payments = [Rec(r.value, n) for n, r in enumerate(feed.payments)]
    outcomes = {
        (frozenset(t.pairs), tuple(sorted(t.unsettled.items())))
        for t in (
            settle(feed, chunk=1000),
            settle(feed, chunk=7, events_first=False),
            settle(feed, chunk=1, events_first=True),
            settle(feed, chunk=40, events_first=False),
        )
    }
    assert len(outcomes) == 1
    pairs, unsettled = outcomes.pop()
    assert 0 < len(pairs) < 150
    assert unsettled


def test_stock_sums_signed_quantities_and_sales_go_to_their_category_and_hour() -> None:
    truth = Truth()
    truth.add_products(0, [Rec(b'{"category": "dairy"}', 0, b"A-1", T0 - 1)])
    truth.add_products(0, [Rec(b'{"category": "frozen"}', 1, b"A-1", T0 + 30 * MINUTE)])
    feed = Feed().sale("e1", T0 + MINUTE).sale("e2", T0 + 40 * MINUTE)
    feed.sale("e3", T0 + 61 * MINUTE, sku="Z-9").restock(T0 + 62 * MINUTE)
    truth.add_events(0, feed.events)
    assert truth.inventory["s1"] == {
        "store_id": "s1",
        "on_hand": {"A-1": -4, "Z-9": -2, "R-1": 5},
        "updated_at": T0 + 62 * MINUTE,
    }
    assert truth.sales == {
        ("dairy", T0): [2, 2.5],
        ("frozen", T0): [2, 2.5],
        ("unknown", T0 + 3_600_000): [2, 2.5],
    }


def test_a_catalogue_version_applies_from_its_timestamp_on() -> None:
    catalogue = Catalogue()
    catalogue.add(b"A-1", 100, 0, b'{"category": "x"}')
    catalogue.add(b"A-1", 200, 1, b'{"category": "y"}')
    catalogue.add(b"B-1", 100, 2, None)
    assert [catalogue.category_at("A-1", t) for t in (99, 100, 199, 200)] == [
        "unknown",
        "x",
        "x",
        "y",
    ]
    assert catalogue.category_at("B-1", 300) == "unknown"


def test_sequence_runs_hold_acknowledged_batches_and_count_repeats() -> None:
    runs = SeqRuns()
    for offset, seq in [(0, 0), (1, 1), (2, 2), (3, 5), (4, 6), (5, 6)]:
        runs.add(offset, seq)
    assert runs.holds(0, 0, 3)
    assert runs.holds(3, 5, 2)
    assert runs.holds(1, 1, 2)
    assert not runs.holds(2, 2, 2)  # seq 3 is not at offset 3
    assert not runs.holds(3, 4, 1)
    assert runs.out_of_sequence == 1


class States:
    """Tables as a comparison reads them."""

    def __init__(self, tables: dict[str, dict[bytes, Any]], pairs: Counter[Any]) -> None:
        self.tables = tables
        self.settled = SettledCopy("127.0.0.1:9")
        self.settled.pairs = pairs

    def state(self, table: str) -> dict[bytes, Any]:
        return self.tables.get(table, {})


def test_a_repeated_sale_is_an_over_count_and_a_lost_one_an_under_count() -> None:
    truth = Truth()
    truth.add_events(0, Feed().sale("e1", T0).sale("e2", T0, store="s2").events)
    window = orjson.dumps(["unknown", [T0 / 1000, T0 / 1000 + 3599.9]])
    tables = {
        "inventory": {
            b"s1": {"store_id": "s1", "on_hand": {"A-1": -4}, "updated_at": T0},
            b"s2": {"store_id": "s2", "on_hand": {"A-1": 0}, "updated_at": T0},
        },
        "sales_by_category": {window: {"units": 4, "revenue": 5.0}},
    }
    found = drift(truth, States(tables, Counter()))
    assert (found.tables["inventory"].over, found.tables["inventory"].under) == (2, 2)
    assert found.tables["sales_by_category"].exact
    assert found.tables["settled-sales"].exact
    assert not found.exact


@pytest.mark.parametrize(
    ("got", "over", "under"),
    [({("e1", "p1"): 2}, 1, 0), ({}, 0, 1), ({("e1", "p1"): 1, ("e9", "p9"): 1}, 1, 0)],
)
def test_settled_pairs_repeated_missing_or_unexpected_are_told_apart(
    got: dict[tuple[str, str], int], over: int, under: int
) -> None:
    truth = settle(Feed().sale("e1", T0).payment("p1", "e1", T0))
    found = drift(truth, States({}, Counter(got))).tables["settled-sales"]
    assert (found.over, found.under, found.exact) == (over, under, False)


def test_a_lost_line_made_up_for_by_a_duplicate_shows_only_in_its_traced_word() -> None:
    truth = Truth()
    truth.add_lines(0, [Rec(b"cat dog", 0), Rec(b"cat dog t0s1n1", 1)])
    # The traced line's effect lost, the other line's applied twice: cat and dog net out.
    tables = {"word_counts": {b"cat": 2, b"dog": 2}}
    found = drift(truth, States(tables, Counter())).tables["word_counts"]
    assert (found.over, found.under) == (0, 1)
    assert (found.traced, found.traced_lost, found.keys_wrong) == (1, 1, 1)
    assert found.wrong_keys == {"t0s1n1"}
    assert not checks.compared(drift_dict(found), "after the kills")[1].ok


def test_a_traced_restock_lost_where_its_store_holds_no_other_wrong_sku() -> None:
    truth = Truth()
    restock = {"event_id": "e1", "store_id": "s1", "sku": "TRC-s1-1", "kind": "restock"}
    restock.update(quantity=3, ts=T0)
    truth.add_events(0, [Rec(orjson.dumps(restock), 0)])
    held = {"store_id": "s1", "on_hand": {}, "updated_at": T0}
    found = drift(truth, States({"inventory": {b"s1": held}}, Counter())).tables["inventory"]
    assert (found.traced, found.traced_lost, found.under) == (1, 1, 3)
    applied = {"store_id": "s1", "on_hand": {"TRC-s1-1": 3}, "updated_at": T0}
    found = drift(truth, States({"inventory": {b"s1": applied}}, Counter())).tables["inventory"]
    assert (found.traced, found.traced_lost, found.exact) == (1, 0, True)


def test_the_comparison_check_fails_when_a_table_had_nothing_to_compare() -> None:
    truth = Truth()
    truth.add_lines(0, [Rec(b"cat t0s1n1", 0)])
    found = drift(truth, States({"word_counts": {b"cat": 1, b"t0s1n1": 1}}, Counter()))
    covered, traced = checks.compared(found.as_dict(), "after the kills")
    assert found.exact
    assert traced.ok
    assert not covered.ok  # the truth holds no inventory, sales or pairs
    assert not checks.compared(None, "after the kills")[0].ok


def drift_dict(table: TableDrift) -> dict[str, Any]:
    """A drift in which every table compared keys and only ``table`` (word_counts) has
    the given figures."""
    others = TableDrift(keys_expected=1, traced=1)
    return {name: (table if name == "word_counts" else others).as_dict() for name in checks.TABLES}
