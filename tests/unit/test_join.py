"""The windowed stream-stream join (tables/join.py) on real RocksDB, without a broker."""

from __future__ import annotations

import random
import tempfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rocksdict import Options, Rdict

from agents.settling import SETTLE_WINDOW
from tables.join import LEFT, RIGHT, JoinWindow, PartitionJoin, Side

MIN = 60_000
WINDOW = JoinWindow(before_ms=0, after_ms=10 * MIN)


class RdictStore:
    """A PartitionStore over one key namespace of a real RocksDB database (the engine's
    views add a batch's pending writes on top; this writes through at once)."""

    def __init__(self, db: Rdict, namespace: bytes) -> None:
        self.db = db
        self.namespace = namespace

    def get(self, key: bytes) -> Any | None:
        raw = self.db.get(self.namespace + key)
        return None if raw is None else orjson.loads(raw)

    def put(self, key: bytes, value: Any) -> None:
        self.db[self.namespace + key] = orjson.dumps(value)

    def delete(self, key: bytes) -> None:
        del self.db[self.namespace + key]

    def scan(self, prefix: bytes) -> Iterator[tuple[bytes, Any]]:
        start = self.namespace + prefix
        for key, raw in self.db.items(from_key=start):
            if not key.startswith(start):
                return
            yield key[len(self.namespace) :], orjson.loads(raw)


@dataclass(frozen=True)
class Rec:
    """One input record: a sale (left), another item event (left, no key) or a payment."""

    side: Side
    ts: int
    offset: int
    key: str | None
    name: str


@dataclass
class Stores:
    """The join's two stores on one RocksDB database; each batch opens a PartitionJoin."""

    window: JoinWindow
    buffer: RdictStore
    index: RdictStore

    def batch(self) -> PartitionJoin:
        return PartitionJoin(self.window, self.buffer, self.index)

    def buffered(self, side: Side) -> int:
        return self.batch().buffered(side)

    def watermark(self, side: Side) -> int | None:
        return self.batch().watermark(side)


def open_join(path: Path, window: JoinWindow = WINDOW) -> Stores:
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    db = Rdict(str(path), options=options)
    return Stores(window, RdictStore(db, b"B/"), RdictStore(db, b"I/"))


@dataclass
class Outcome:
    pairs: Counter[tuple[str, str]]
    unmatched: Counter[str]


def run(stores: Stores, records: list[Rec], batch: int = 1) -> Outcome:
    """Apply ``records`` in batches of ``batch`` records, each finished (expired) alone."""
    outcome = Outcome(Counter(), Counter())
    for start in range(0, len(records), batch):
        join = stores.batch()
        for rec in records[start : start + batch]:
            join.process(rec.side, rec.ts, rec.offset, rec.key, rec.name)
        result = join.finish()
        outcome.pairs.update(result.pairs)
        outcome.unmatched.update(result.unmatched)
    return outcome


def sale(offset: int, ts: int, event_id: str) -> Rec:
    return Rec(LEFT, ts, offset, event_id, event_id)


def restock(offset: int, ts: int) -> Rec:
    return Rec(LEFT, ts, offset, None, f"restock@{ts}")


def payment(offset: int, ts: int, sale_event_id: str, name: str) -> Rec:
    return Rec(RIGHT, ts, offset, sale_event_id, name)


@pytest.fixture
def join(tmp_path: Path) -> Stores:
    return open_join(tmp_path / "db")


# -- the window ----------------------------------------------------------------------


def test_window_holds_payments_from_the_sale_to_ten_minutes_after() -> None:
    assert WINDOW.contains(1_000, 1_000)
    assert WINDOW.contains(1_000, 1_000 + 10 * MIN)
    assert not WINDOW.contains(1_000, 1_000 + 10 * MIN + 1)
    assert not WINDOW.contains(1_000, 999)


def test_window_bounds_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="negative"):
        JoinWindow(before_ms=-1, after_ms=0)
    with pytest.raises(ValueError, match="negative"):
        JoinWindow(before_ms=0, after_ms=0, left_grace_ms=-1)


def test_event_time_passes_a_window_only_strictly_after_its_end() -> None:
    assert not WINDOW.left_passed(0, None)
    assert not WINDOW.left_passed(0, 10 * MIN)
    assert WINDOW.left_passed(0, 10 * MIN + 1)
    assert not WINDOW.left_closed(0, 10 * MIN)
    assert WINDOW.left_closed(0, 10 * MIN + 1)


def test_each_sides_grace_delays_the_closing_of_the_other_sides_records() -> None:
    window = JoinWindow(0, 10 * MIN, left_grace_ms=MIN, right_grace_ms=2 * MIN)
    assert not window.left_closed(0, 12 * MIN)
    assert window.left_closed(0, 12 * MIN + 1)
    assert not window.right_closed(0, MIN)
    assert window.right_closed(0, MIN + 1)


# -- matching ------------------------------------------------------------------------


def test_payment_in_window_settles_its_sale_whichever_comes_first(tmp_path: Path) -> None:
    records = [sale(0, 0, "e1"), payment(0, 5 * MIN, "e1", "p1")]
    for i, order in enumerate([records, records[::-1]]):
        outcome = run(open_join(tmp_path / str(i)), order)
        assert outcome.pairs == Counter({("e1", "p1"): 1})
        assert not outcome.unmatched


def test_payment_after_the_window_settles_nothing(join: Stores) -> None:
    outcome = run(join, [sale(0, 0, "e1"), payment(0, 10 * MIN + 1, "e1", "p1")])
    assert not outcome.pairs


def test_payment_for_another_sale_settles_nothing(join: Stores) -> None:
    outcome = run(join, [sale(0, 0, "e1"), payment(0, MIN, "e2", "p1")])
    assert not outcome.pairs


def test_every_payment_of_a_sale_pairs_once(join: Stores) -> None:
    outcome = run(
        join,
        [payment(0, MIN, "e1", "p1"), sale(0, 0, "e1"), payment(1, 2 * MIN, "e1", "p2")],
    )
    assert outcome.pairs == Counter({("e1", "p1"): 1, ("e1", "p2"): 1})


def test_replayed_record_does_not_duplicate_the_buffer(join: Stores) -> None:
    run(join, [sale(7, 0, "e1"), sale(7, 0, "e1")])
    assert join.buffered(LEFT) == 1


# -- unmatched sales -----------------------------------------------------------------


def test_unmatched_sale_waits_for_event_time_on_both_sides(join: Stores) -> None:
    first = run(join, [sale(0, 0, "e1"), restock(1, 10 * MIN + 1)])
    assert not first.unmatched  # payments' event time has not passed the window yet
    second = run(join, [payment(0, 10 * MIN, "other", "p9")])
    assert not second.unmatched  # 10 min is inside the window, not past it
    third = run(join, [payment(1, 10 * MIN + 1, "other", "p8")])
    assert third.unmatched == Counter({"e1": 1})


def test_unmatched_sale_is_reported_once(join: Stores) -> None:
    outcome = run(
        join,
        [sale(0, 0, "e1"), restock(1, 20 * MIN), payment(0, 20 * MIN, "x", "p")]
        + [restock(2 + i, 30 * MIN + i) for i in range(3)],
    )
    assert outcome.unmatched == Counter({"e1": 1})


def test_settled_sale_is_not_reported_unmatched(join: Stores) -> None:
    outcome = run(
        join,
        [
            sale(0, 0, "e1"),
            payment(0, MIN, "e1", "p1"),
            restock(1, 60 * MIN),
            payment(1, 60 * MIN, "x", "p2"),
        ],
    )
    assert not outcome.unmatched


def test_sale_arriving_after_both_sides_passed_it_is_reported_at_once(
    join: Stores,
) -> None:
    run(join, [restock(0, 60 * MIN), payment(0, 60 * MIN, "x", "p")])
    outcome = run(join, [sale(1, 0, "late")])
    assert outcome.unmatched == Counter({"late": 1})
    assert join.buffered(LEFT) == 0


# -- lateness: the rule that makes the result independent of the interleaving --------


def test_payment_behind_its_topics_event_time_misses_closed_sales(tmp_path: Path) -> None:
    # Payments' event time passes the sale's window before the payment arrives: whether
    # the sale was consumed before or after, the late payment must not settle it.
    sales = [sale(0, 0, "e1")]
    payments = [payment(0, 11 * MIN, "x", "p0"), payment(1, 5 * MIN, "e1", "p1")]
    first = run(open_join(tmp_path / "a"), sales + payments)
    second = run(open_join(tmp_path / "b"), payments + sales)
    assert first.pairs == second.pairs == Counter()


def test_payment_behind_its_topics_event_time_still_meets_open_sales(tmp_path: Path) -> None:
    sales = [sale(0, 0, "e1")]
    payments = [payment(0, 9 * MIN, "x", "p0"), payment(1, 5 * MIN, "e1", "p1")]
    first = run(open_join(tmp_path / "a"), sales + payments)
    second = run(open_join(tmp_path / "b"), payments + sales)
    assert first.pairs == second.pairs == Counter({("e1", "p1"): 1})


def test_right_grace_lets_a_disordered_payment_settle(tmp_path: Path) -> None:
    window = JoinWindow(before_ms=0, after_ms=10 * MIN, right_grace_ms=2 * MIN)
    sales = [sale(0, 0, "e1")]
    payments = [payment(0, 11 * MIN, "x", "p0"), payment(1, 5 * MIN, "e1", "p1")]
    first = run(open_join(tmp_path / "a", window), sales + payments)
    second = run(open_join(tmp_path / "b", window), payments + sales)
    assert first.pairs == second.pairs == Counter({("e1", "p1"): 1})


def test_sale_behind_its_topics_event_time_misses_expired_payments(tmp_path: Path) -> None:
    sales = [sale(0, 2 * MIN, "e2"), sale(1, 0, "e1")]
    payments = [payment(0, MIN, "e1", "p1")]
    first = run(open_join(tmp_path / "a"), sales + payments)
    second = run(open_join(tmp_path / "b"), payments + sales)
    assert first.pairs == second.pairs == Counter()


def test_left_grace_lets_a_disordered_sale_meet_its_payment(tmp_path: Path) -> None:
    window = JoinWindow(before_ms=0, after_ms=10 * MIN, left_grace_ms=10 * MIN)
    sales = [sale(0, 9 * MIN, "e2"), sale(1, 0, "e1")]
    payments = [payment(0, MIN, "e1", "p1")]
    first = run(open_join(tmp_path / "a", window), sales + payments)
    second = run(open_join(tmp_path / "b", window), payments + sales)
    assert first.pairs == second.pairs == Counter({("e1", "p1"): 1})


# -- bounded state -------------------------------------------------------------------


def test_expired_records_leave_the_buffers(join: Stores) -> None:
    for i in range(200):
        ts = i * MIN
        run(join, [sale(i, ts, f"e{i}"), payment(i, ts + (i % 3) * 6 * MIN, f"e{i}", f"p{i}")])
        # Records stay while a partner may come: about 10 minutes' worth on each side.
        assert join.buffered(LEFT) <= 12
        assert join.buffered(RIGHT) <= 12


def test_every_buffered_value_goes_once_both_sides_have_passed_it(join: Stores) -> None:
    records = []
    for i in range(60):
        records.append(sale(i, i * MIN, f"e{i}"))
        records.append(payment(2 * i, i * MIN + (i % 4) * 3 * MIN, f"e{i}", f"p{i}"))
        records.append(payment(2 * i + 1, i * MIN + 11 * MIN, f"e{i}", f"late{i}"))
    run(join, records, batch=7)
    assert join.buffered(LEFT) > 0  # the last ten minutes are still open
    run(join, [payment(1000, 200 * MIN, "x", "p"), restock(1000, 300 * MIN)])
    assert join.buffered(LEFT) == join.buffered(RIGHT) == 0
    assert list(join.buffer.scan(b"")) == []  # no value left behind by an expired sale
    assert [k for k, _ in join.index.scan(b"")] == [b"wl", b"wr"]


def test_a_batch_writes_one_index_chunk_per_side_and_minute(join: Stores) -> None:
    records = [sale(i, 5 * MIN + i, f"e{i}") for i in range(100)]
    records += [payment(i, 5 * MIN + 200 + i, f"e{i}", f"p{i}") for i in range(50)]
    run(join, records, batch=len(records))
    chunks = [k for k, _ in join.index.scan(b"c")]
    assert len(chunks) == 2
    assert join.buffered(LEFT) == 100
    assert join.buffered(RIGHT) == 50


def test_watermarks_are_kept_per_side(join: Stores) -> None:
    run(join, [restock(0, 5), payment(0, 9, "x", "p"), restock(1, 3)])
    assert join.watermark(LEFT) == 5
    assert join.watermark(RIGHT) == 9


# -- any interleaving ----------------------------------------------------------------


def contract_outcome(sales: list[Rec], others: list[Rec], payments: list[Rec]) -> Outcome:
    """The contract's settling rule, computed directly from complete inputs."""
    after = WINDOW.after_ms
    pairs = Counter(
        (s.name, p.name)
        for s in sales
        for p in payments
        if p.key == s.key and s.ts <= p.ts <= s.ts + after
    )
    left_time = max((r.ts for r in sales + others), default=None)
    right_time = max((r.ts for r in payments), default=None)
    settled = {name for name, _ in pairs}
    unmatched = Counter(
        s.name
        for s in sales
        if s.name not in settled
        and left_time is not None
        and right_time is not None
        and min(left_time, right_time) > s.ts + after
    )
    return Outcome(pairs, unmatched)


def interleave(left: list[Rec], right: list[Rec], rng: random.Random) -> list[Rec]:
    """A random merge keeping each topic's own order."""
    slots = [LEFT] * len(left) + [RIGHT] * len(right)
    rng.shuffle(slots)
    sides = {LEFT: iter(left), RIGHT: iter(right)}
    return [next(sides[side]) for side in slots]


def generate(rng: random.Random, sales_n: int, disorder_ms: int) -> tuple[list[Rec], list[Rec]]:
    """Sales every few minutes; payments in window, late or missing; restocks between."""
    left: list[Rec] = []
    right: list[Rec] = []
    ts = 0
    for i in range(sales_n):
        ts += rng.randrange(0, 4 * MIN)
        left.append(sale(len(left), ts, f"e{i}"))
        if rng.random() < 0.3:
            left.append(restock(len(left), ts + rng.randrange(MIN)))
        kind = rng.choice(["in-window", "in-window", "edge", "late", "missing", "two"])
        delays = {
            "in-window": [rng.randrange(10 * MIN)],
            "edge": [10 * MIN],
            "late": [10 * MIN + 1 + rng.randrange(5 * MIN)],
            "missing": [],
            "two": [rng.randrange(10 * MIN), rng.randrange(20 * MIN)],
        }[kind]
        for n, delay in enumerate(delays):
            right.append(payment(len(right), ts + delay, f"e{i}", f"p{i}.{n}"))
    left.sort(key=lambda r: r.ts + rng.randrange(disorder_ms + 1))
    right.sort(key=lambda r: r.ts + rng.randrange(disorder_ms + 1))
    renumber = [Rec(r.side, r.ts, n, r.key, r.name) for n, r in enumerate(left)]
    return renumber, [Rec(r.side, r.ts, n, r.key, r.name) for n, r in enumerate(right)]


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    sales_n=st.integers(0, 25),
    window=st.sampled_from([WINDOW, SETTLE_WINDOW]),
)
def test_in_order_topics_give_the_contract_result_in_any_interleaving(
    seed: int, sales_n: int, window: JoinWindow
) -> None:
    rng = random.Random(seed)
    left, right = generate(rng, sales_n, disorder_ms=0)
    expected = contract_outcome(
        [r for r in left if r.key is not None], [r for r in left if r.key is None], right
    )
    orders = [left + right, right + left, interleave(left, right, rng)]
    with tempfile.TemporaryDirectory() as tmp:
        for i, records in enumerate(orders):
            assert run(open_join(Path(tmp) / str(i), window), records) == expected


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    sales_n=st.integers(0, 25),
    disorder=st.sampled_from([MIN, 5 * MIN, 30 * MIN]),
    left_grace=st.sampled_from([0, 2 * MIN, 10 * MIN]),
    right_grace=st.sampled_from([0, 2 * MIN]),
    before=st.sampled_from([0, 3 * MIN]),
)
def test_disordered_topics_give_one_result_in_any_interleaving(
    seed: int, sales_n: int, disorder: int, left_grace: int, right_grace: int, before: int
) -> None:
    rng = random.Random(seed)
    left, right = generate(rng, sales_n, disorder_ms=disorder)
    window = JoinWindow(before, 10 * MIN, left_grace_ms=left_grace, right_grace_ms=right_grace)
    orders = [left + right, right + left, interleave(left, right, rng)]
    with tempfile.TemporaryDirectory() as tmp:
        outcomes = [run(open_join(Path(tmp) / str(i), window), o) for i, o in enumerate(orders)]
    assert outcomes[0] == outcomes[1] == outcomes[2]


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    sales_n=st.integers(0, 25),
    disorder=st.sampled_from([0, MIN, 30 * MIN]),
    batch=st.integers(2, 40),
    grace=st.sampled_from([0, 2 * MIN]),
)
def test_expiring_once_per_batch_gives_the_result_of_expiring_after_every_record(
    seed: int, sales_n: int, disorder: int, batch: int, grace: int
) -> None:
    rng = random.Random(seed)
    left, right = generate(rng, sales_n, disorder_ms=disorder)
    window = JoinWindow(0, 10 * MIN, left_grace_ms=grace, right_grace_ms=grace)
    records = interleave(left, right, rng)
    with tempfile.TemporaryDirectory() as tmp:
        every_record = run(open_join(Path(tmp) / "a", window), records)
        per_batch = run(open_join(Path(tmp) / "b", window), records, batch=batch)
    assert per_batch == every_record


def test_a_replayed_sale_whose_index_entry_was_lost_still_expires_and_counts(
    join: Stores,
) -> None:
    # at_least_once: a crash landed the buffer's changelog record but not the index's
    run(join, [sale(0, 0, "e1")])
    for key, _entries in list(join.index.scan(b"c")):
        join.index.delete(key)
    assert join.buffered(LEFT) == 0
    # the sale is fetched again (its offset was not committed), then time passes it
    outcome = run(join, [sale(0, 0, "e1"), restock(1, 20 * MIN), payment(0, 20 * MIN, "x", "p")])
    assert outcome.unmatched == Counter({"e1": 1})


def test_a_replayed_record_is_indexed_once(join: Stores) -> None:
    run(join, [sale(0, 0, "e1"), payment(0, MIN, "e1", "p1")])
    run(join, [sale(0, 0, "e1"), payment(0, MIN, "e1", "p1")], batch=2)
    assert (join.buffered(LEFT), join.buffered(RIGHT)) == (1, 1)


def test_a_record_replayed_in_its_own_batch_is_indexed_once(join: Stores) -> None:
    run(join, [sale(0, 0, "e1"), sale(0, 0, "e1"), sale(1, 1, "e2"), sale(1, 1, "e2")], batch=4)
    assert join.buffered(LEFT) == 2
