"""The pure helpers of the Kafka Streams comparison: the tables check, peak memory,
the build's digest and the inventory data's payments."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import orjson
import pytest

from bench import data, kstreams
from bench.procs import peak_rss_from_status
from bench.progress import Progress
from bench.scenarios.runs import Measured
from bench.tables import changelog_table, compare, compare_table, pair_id, same, table_key
from tables.windows import window_key
from tests.support.workers import cpu_from_stat

HOUR_MS = 3_600_000


def test_changelog_table_keeps_the_last_value_and_applies_tombstones() -> None:
    records = [
        (b"the", b"1"),
        (b"cat", b"2"),
        (b"the", b"3"),
        (b"cat", None),
        (b"\xff\xffstreamstate.position", b"{}"),  # the engine's position: no table key
    ]
    assert changelog_table("word_counts", records) == {"the": 3}


def test_window_keys_become_category_at_window_start() -> None:
    start = 1_700_002_800_000
    assert table_key("sales_by_category", window_key("dairy", start, 3600.0)) == f"dairy@{start}"
    assert table_key("sales_by_category", b"not a window") is None
    assert table_key("inventory", "störe".encode()) == "störe"


def test_same_tolerates_float_sums_in_another_order_only() -> None:
    assert same({"units": 3, "revenue": 0.1 + 0.2}, {"units": 3, "revenue": 0.3})
    assert not same({"units": 3, "revenue": 0.3}, {"units": 4, "revenue": 0.3})
    assert not same({"a": 1}, {"a": 1, "b": 2})
    assert same([1, "x"], [1, "x"])
    assert not same(True, 1.5)


def test_compare_counts_keys_missing_on_either_side_and_other_values() -> None:
    diff = compare_table({"a": 1, "b": 2, "c": 3}, {"b": 2, "c": 4, "d": 5}, examples=2)
    assert (diff.keys, diff.only_first, diff.only_second, diff.different) == (4, 1, 1, 1)
    assert diff.examples == [("a", 1, None), ("c", 3, 4)]
    assert not diff.equal
    assert "1 with other values" in diff.describe("the project", "Kafka Streams")


def test_compare_treats_a_missing_table_as_empty() -> None:
    differences = compare({"word_counts": {"a": 1}}, {"word_counts": {"a": 1}, "extra": {}})
    assert differences["word_counts"].equal
    assert differences["extra"].equal
    assert compare({"t": {"a": 1}}, {})["t"].only_first == 1


def test_pair_id_names_the_sale_and_the_payment() -> None:
    value = orjson.dumps({"sale": {"event_id": "e4"}, "payment": {"payment_id": "p4"}})
    assert pair_id(value) == "e4/p4"


def test_peak_rss_is_read_from_vmhwm() -> None:
    status = "Name:\tjava\nVmPeak:\t 9000 kB\nVmHWM:\t  2048 kB\nVmRSS:\t 1024 kB\n"
    assert peak_rss_from_status(status) == 2048 * 1024
    assert peak_rss_from_status("Name:\tzombie\n") is None


def test_the_build_digest_changes_with_a_main_source(tmp_path: Path) -> None:
    source = tmp_path / "src" / "main" / "java" / "A.java"
    source.parent.mkdir(parents=True)
    (tmp_path / "pom.xml").write_text("<project/>")
    source.write_text("class A {}")
    before = kstreams.source_digest(tmp_path)
    (tmp_path / "src" / "test").mkdir()
    (tmp_path / "src" / "test" / "ATest.java").write_text("class ATest {}")
    assert kstreams.source_digest(tmp_path) == before
    source.write_text("class A { int x; }")
    assert kstreams.source_digest(tmp_path) != before


def test_rate_runs_to_the_end_of_a_finished_run_and_is_zero_without_progress() -> None:
    finished = Progress(1000, series=[(1.0, 0.0), (3.0, 1000.0)], finished=True)
    finished.source_series = [(1.0, 0), (2.0, 200), (3.0, 1000)]
    assert Measured("run", finished, None).rate == pytest.approx(800.0)
    idle = Progress(1000, series=[(1.0, 0.0), (2.0, 0.0)])
    assert Measured("idle", idle, 3 * 1024 * 1024).rate == 0.0
    assert Measured("idle", idle, 3 * 1024 * 1024).peak_rss_mib == 3.0


def test_event_time_spreads_events_evenly_over_the_span() -> None:
    clock = data.EventTime(start_ms=1_000, span_ms=2 * HOUR_MS, count=100)
    assert clock.of(0) == 1_000
    assert clock.of(50) == 1_000 + HOUR_MS
    events = [orjson.loads(v) for _k, v in data.item_events(100, clock=clock)]
    assert [e["ts"] for e in events] == [clock.of(n) for n in range(100)]


def test_payments_pay_half_the_sales_mostly_in_the_window_in_time_order() -> None:
    clock = data.EventTime(start_ms=0, span_ms=2 * HOUR_MS, count=2000)
    events = {
        e["event_id"]: e for e in (orjson.loads(v) for _k, v in data.item_events(2000, clock=clock))
    }
    sales = [e for e in events.values() if e["kind"] == "sale"]
    paid = [orjson.loads(v) for _k, v in data.payments(2000, clock)]
    assert len(paid) == len(sales) // 2
    delays = [p["ts"] - events[p["sale_event_id"]]["ts"] for p in paid]
    late = sum(d > data.SETTLE_WINDOW_MS for d in delays)
    assert 0 < late < len(paid) // 4
    assert min(delays) >= 0
    assert [p["ts"] for p in paid] == sorted(p["ts"] for p in paid)
    assert all(p["store_id"] == events[p["sale_event_id"]]["store_id"] for p in paid)


def test_unknown_skus_and_second_product_versions() -> None:
    events = [orjson.loads(v) for _k, v in data.item_events(200, unknown_every=50)]
    unknown = Counter(e["sku"].startswith("XXX-") for e in events)
    assert unknown[True] == 4
    products = data.catalogue()
    changed = [orjson.loads(v) for _k, v in data.recategorised(products, every=10)]
    assert changed
    assert all(p["category"] != products.products[p["sku"]]["category"] for p in changed)


def test_the_comparison_plot_is_drawn_only_with_a_kafka_streams_figure(tmp_path: Path) -> None:
    from bench import plots

    assert not plots.kstreams({"wordcount": {"events_per_s": 1.0}}, tmp_path / "none.png")
    figures = {
        "wordcount": {
            "events_per_s": 120_000.0,
            "baseline_kstreams_events_per_s": 40_000.0,
            "ceiling_aiokafka_events_per_s": 200_000.0,
            "peak_rss_mib": 150.0,
        },
        "inventory": {"events_per_s": 2_000.0},
    }
    assert plots.draw({}, tmp_path, figures) == ["kstreams.png"]
    assert (tmp_path / "kstreams.png").stat().st_size > 1000


def test_metric_values_are_read_from_the_prometheus_text() -> None:
    from bench.scenarios.runs import metric_value

    text = (
        "# HELP streamstate_batch_cycles Batch cycles the engine completed.\n"
        "# TYPE streamstate_batch_cycles counter\n"
        "streamstate_batch_cycles_total 42.0\n"
        'streamstate_events_total{agent="words.split"} 7.0\n'
    )
    assert metric_value(text, "streamstate_batch_cycles") == 42.0
    assert metric_value(text, "streamstate_events") is None


def test_the_commit_interval_is_the_processing_window_over_the_cycles() -> None:
    progress = Progress(100, series=[(0.0, 0.0), (1.0, 50.0), (3.0, 100.0)], finished=True)
    progress.source_series = [(0.0, 0), (1.0, 60), (3.0, 100)]
    assert Measured("run", progress, None, cycles=20).commit_interval_ms == pytest.approx(100.0)
    assert Measured("run", progress, None).commit_interval_ms is None


def test_kafka_streams_commits_as_often_as_the_project_did(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kstreams, "COMMIT_MS_SETTING", None)
    assert kstreams.commit_interval_ms(274.4) == 274
    assert kstreams.commit_interval_ms(2.0) == 10
    assert kstreams.commit_interval_ms(120_000.0) == 30_000
    assert kstreams.commit_interval_ms(None) == kstreams.COMMIT_MS
    monkeypatch.setattr(kstreams, "COMMIT_MS_SETTING", "5000")
    assert kstreams.commit_interval_ms(274.4) == 5000


def test_the_first_error_of_a_worker_log_names_its_exception() -> None:
    from bench.scenarios.runs import last_error

    log = (
        "[2026-11-25 08:18:13,446] [25733] [INFO] task 0 started\n"
        "[2026-11-25 08:18:15,545] [25733] [ERROR] [^--_Consumer]: Crashed reason=Assert()\n"
        "Traceback (most recent call last):\n"
        '  File "x.py", line 1, in f\n'
        "AssertionError\n"
    )
    assert last_error(log) == "[^--_Consumer]: Crashed reason=Assert() AssertionError"
    assert last_error("[INFO] fine\n") == "no error in its log"


def test_records_are_stamped_with_their_event_time() -> None:
    clock = data.EventTime(start_ms=5_000, span_ms=1_000, count=10)
    stamped = list(data.at_event_time(data.item_events(3, clock=clock)))
    assert [ts for _k, _v, ts in stamped] == [5_000, 5_100, 5_200]
    assert stamped[0][0] == orjson.loads(stamped[0][1])["store_id"].encode()


def test_the_cpu_of_a_process_is_its_user_and_system_ticks() -> None:
    # pid (comm with a space and a parenthesis) state ppid ... utime=250 stime=50 ...
    stat = "42 (faust (w) 1) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 9 0 7 0 0"
    assert cpu_from_stat(stat, 100) == 3.0
