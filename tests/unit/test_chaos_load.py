"""The chaos load: its data, its event clock, its level and its ledger (no broker)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import orjson

from chaos.load import AckedBatch, acked_batches, bench_level
from chaos.loadgen import LEDGER_ENTRY, TOPICS
from chaos.truth import words_of
from chaos.workload import (
    ADJUST_DOWN_SKUS,
    ADJUST_UP_SKUS,
    MINUTE_MS,
    PARTITIONS,
    RESTOCK_SKUS,
    SALE_SKUS,
    SETTLE_WINDOW_MS,
    TRACE_EVENT_EVERY,
    TRACE_LINE_EVERY,
    UNKNOWN_SKUS,
    Clock,
    Workload,
    is_traced_sku,
    is_traced_word,
    partition_of,
    product_records,
)


def test_prices_are_dyadic_so_revenue_sums_are_exact_in_any_order() -> None:
    for price in [*SALE_SKUS.values(), *UNKNOWN_SKUS.values()]:
        assert (price * 4).is_integer()
        assert price > 0


def test_each_sku_moves_stock_one_way_only() -> None:
    workload = Workload(seed=1, run_id="t")
    moves: dict[str, set[int]] = {}
    for record in workload.next_events(3000, now_ms=1_750_000_000_000):
        event = orjson.loads(record.value)
        sign = -1 if event["kind"] == "sale" else (1 if event["quantity"] > 0 else -1)
        moves.setdefault(event["sku"], set()).add(sign)
    assert all(len(signs) == 1 for signs in moves.values())
    growing = {s for s, signs in moves.items() if signs == {1} and not is_traced_sku(s)}
    assert growing == {*RESTOCK_SKUS, *ADJUST_UP_SKUS}
    assert set(ADJUST_DOWN_SKUS) <= set(moves)


def test_traced_records_feed_keys_of_their_own_on_every_partition() -> None:
    workload = Workload(seed=1, run_id="s7")
    lines = workload.next_lines(TRACE_LINE_EVERY * 80)
    traced = [
        (r.partition, w) for r in lines for w in words_of(r.value.decode()) if is_traced_word(w)
    ]
    assert len(traced) == 80
    assert len({w for _p, w in traced}) == 80
    assert {p for p, _w in traced} == set(range(PARTITIONS))
    vocabulary = {w for r in lines for w in words_of(r.value.decode()) if not is_traced_word(w)}
    assert not any(is_traced_word(w) for w in vocabulary)
    events = [orjson.loads(r.value) for r in workload.next_events(TRACE_EVENT_EVERY * 50, 0)]
    skus = [e["sku"] for e in events if is_traced_sku(e["sku"])]
    assert len(skus) == len(set(skus)) == 50
    assert all(e["kind"] == "restock" for e in events if is_traced_sku(e["sku"]))


def test_events_go_to_their_stores_partition_and_payments_come_due_on_their_time() -> None:
    workload = Workload(seed=2, run_id="t")
    now = 1_750_000_000_000
    events = workload.next_events(2000, now)
    for record in events:
        assert record.key is not None
        assert record.partition == partition_of(record.key)
    sales = {
        e["event_id"]: e
        for e in map(orjson.loads, (r.value for r in events))
        if e["kind"] == "sale"
    }
    assert not workload.due_payments(now - 1)
    due = workload.due_payments(now + 20 * MINUTE_MS)
    assert 0.35 * len(sales) < len(due) < 0.65 * len(sales)
    delays = [
        orjson.loads(p.value)["ts"] - sales[orjson.loads(p.value)["sale_event_id"]]["ts"]
        for p in due
    ]
    assert 0 in delays
    assert SETTLE_WINDOW_MS in delays
    assert any(d > SETTLE_WINDOW_MS for d in delays)


def test_the_catalogue_names_every_sale_sku_but_the_unknown_ones() -> None:
    skus = {key.decode() for key, _value, _ts in product_records(1_750_000_000_000)}
    assert skus == set(SALE_SKUS)
    assert not skus & set(UNKNOWN_SKUS)


def test_the_event_clock_runs_fast_but_never_far_past_the_wall_clock() -> None:
    now = int(time.time() * 1000)
    clock = Clock(start_ms=now - 60 * MINUTE_MS, speed=10.0)
    assert clock.at(60.0) == now - 50 * MINUTE_MS
    assert clock.at(1e6) <= int(time.time() * 1000) + clock.max_ahead_ms


def test_the_ledger_reads_back_the_acknowledged_batches(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.bin"
    entries = [(0, 3, 1000, 17, 40), (2, 7, 5, 0, 1)]
    ledger.write_bytes(b"".join(LEDGER_ENTRY.pack(*e) for e in entries) + b"\x01\x02")
    assert list(acked_batches(ledger)) == [
        AckedBatch(TOPICS[0], 3, 1000, 17, 40),
        AckedBatch(TOPICS[2], 7, 5, 0, 1),
    ]


def test_the_full_level_is_half_of_the_benchmark(tmp_path: Path) -> None:
    summary = tmp_path / "summary.json"
    document = {
        "machine": {"git_commit": "abc1234"},
        "wordcount": {"events_per_s": 100_000.4},
        "inventory": {"events_per_s": 7_001.0},
    }
    summary.write_text(json.dumps(document))
    level = bench_level(summary)
    assert (level.lines_per_s, level.events_per_s) == (50_000, 3_500)
    assert "abc1234" in level.source
