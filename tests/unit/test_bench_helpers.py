"""The pure helpers of the benchmarks: percentiles, rates, progress and the report."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import hiccups, machine, report
from bench.progress import Progress, processed
from bench.scenarios import inventory
from bench.scenarios.restore import restores_in
from bench.scenarios.runs import Measured, median_run
from bench.stats import completion_rate, instant_rates, percentile, percentiles, ratio, steady_rate


def test_percentile_interpolates_between_closest_ranks() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == pytest.approx(50.5)
    assert percentile(values, 99) == pytest.approx(99.01)
    assert percentile(values, 100) == 100.0
    assert percentile([], 99) is None
    assert percentiles([3.0, 1.0, 2.0], (0, 50)) == {"p0": 1.0, "p50": 2.0}


def test_steady_rate_starts_at_the_first_progress() -> None:
    series = [(0.0, 0.0), (5.0, 0.0), (6.0, 100.0), (8.0, 500.0)]
    assert steady_rate(series) == pytest.approx(200.0)
    assert steady_rate([(0.0, 0.0), (1.0, 0.0)]) is None


def test_completion_rate_runs_from_the_first_source_commit_to_the_end() -> None:
    series = [(0.0, 0.0), (1.0, 0.0), (2.0, 400.0), (3.0, 900.0)]
    # 600 records after the first commit at 2.0 s, all done at 5.0 s.
    assert completion_rate(series, 1000, 5.0) == pytest.approx(200.0)
    assert completion_rate([(0.0, 0.0)], 1000, 5.0) is None
    assert completion_rate(series, 1000, 2.0) is None


def test_instant_rates_skip_polls_without_a_new_commit() -> None:
    series = [(0.0, 0.0), (1.0, 100.0), (1.5, 100.0), (3.0, 400.0)]
    assert instant_rates(series) == [(0.5, 100.0), (2.0, 150.0)]


def test_processed_scales_by_the_committed_share_of_downstream_topics() -> None:
    committed = {"text-lines": 1000, "repartition": 2500}
    ends = {"repartition": 10_000}
    assert processed(committed, ends, "text-lines", ["repartition"]) == 250.0
    assert processed(committed, {}, "text-lines", ["repartition"]) == 1000.0


def test_restore_lines_are_read_from_the_worker_log() -> None:
    log = (
        "[INFO] restore 1 done: 1000000 changelog records in 12.500 s (80000 records/s)\n"
        "[INFO] restore 2 done: 0 changelog records in 0.010 s (0 records/s)\n"
    )
    assert restores_in(log) == [(1_000_000, 12.5), (0, 0.01)]


def test_summary_has_exactly_the_schema_keys() -> None:
    summary = report.summary({"cores": 2}, {"iq": {"local_rps": 10.0, "extra": 1}})
    assert summary["iq"] == {
        "local_rps": 10.0,
        "local_p99_ms": None,
        "routed_rps": None,
        "routed_p99_ms": None,
        "load_generator": None,
        "standby_catch_up_s": None,
        "standby_records": None,
        "machine_slow_pct": None,
        "machine_longest_slow_ms": None,
    }
    assert list(summary) == ["machine", *report.SCHEMA]


def test_table_shows_ratios_against_baselines_and_targets() -> None:
    summary = report.summary(
        {},
        {
            "wordcount": {
                "events_per_s": 1000.0,
                "baseline_faust_events_per_s": 100.0,
                "ceiling_aiokafka_events_per_s": 4000.0,
            },
            "iq": {"local_p99_ms": 25.0},
        },
    )
    table = report.table(summary)
    assert "| wordcount | vs the faust baseline |  | ≥ 5x | 10.00x | yes |" in table
    assert "| wordcount | vs the aiokafka ceiling |  | ≥ 0.75x | 0.25x | **no** |" in table
    assert "| iq | key reads, local p99 | 25.0 ms | ≤ 5 ms | 5.00 | **no** |" in table
    assert ratio(1.0, 0.0) is None


def test_table_holds_both_scenarios_against_kafka_streams_in_the_same_run() -> None:
    summary = report.summary(
        {},
        {
            "wordcount": {
                "events_per_s": 120_000.0,
                "eos_events_per_s": 90_000.0,
                "baseline_kstreams_events_per_s": 30_000.0,
                "baseline_kstreams_eos_events_per_s": 25_000.0,
                "peak_rss_mib": 150.0,
                "kstreams_tables_equal": True,
            },
            "inventory": {
                "events_per_s": 20_000.0,
                "eos_events_per_s": 16_000.0,
                "ceiling_consume_parse_events_per_s": 150_000.0,
                "baseline_kstreams_events_per_s": 8_000.0,
                "kstreams_tables_equal": False,
            },
        },
    )
    table = report.table(summary)
    assert "| wordcount | vs Kafka Streams (at_least_once) |  | ≥ 4x | 4.00x | yes |" in table
    assert (
        "| wordcount | exactly_once vs Kafka Streams (exactly_once_v2) |  | ≥ 4x | 3.60x | **no** |"
        in table
    )
    assert "| wordcount | tables equal to Kafka Streams' | yes | yes |  | yes |" in table
    assert "| wordcount | peak RSS, project worker | 150 MiB |  |  |  |" in table
    assert (
        "| inventory | inventory, project worker | 20,000 events/s | ≥ 25,000 events/s "
        "| 0.80 | **no** |" in table
    )
    assert "| inventory | exactly_once vs at_least_once |  | ≥ 0.7x | 0.80x | yes |" in table
    assert "| inventory | vs the consume+parse ceiling |  | ≥ 0.12x | 0.13x | yes |" in table
    assert "| inventory | vs Kafka Streams (at_least_once) |  | ≥ 2.5x | 2.50x | yes |" in table
    assert (
        "| inventory | exactly_once vs the consume+parse ceiling |  | ≥ 0.12x | 0.11x | **no** |"
        in table
    )
    assert "| inventory | tables equal to Kafka Streams' | no | yes |  | **no** |" in table
    assert "| inventory | Kafka Streams, exactly_once_v2 | n/a |  |  |  |" in table
    assert summary["inventory"]["peak_rss_mib"] is None


def test_a_ceiling_is_its_median_run_with_every_run_kept() -> None:
    rates = [150_000.0, 225_000.0, 180_000.0]
    found = median_run(lambda i: {"events_per_s": rates[i], "run": i}, runs=3)
    assert found["run"] == 2
    assert found["events_per_s"] == 180_000.0
    assert found["runs_events_per_s"] == rates


def test_steal_is_read_from_proc_stat_and_shared_over_all_ticks(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    stat.write_text("cpu  100 0 50 800 10 0 5 35 0 0\ncpu0 50 0 25 400 5 0 2 18 0 0\n")
    before = machine.cpu_ticks(str(stat))
    assert before == (35, 1000)
    stat.write_text("cpu  300 0 100 1300 10 0 5 85 0 0\n")
    after = machine.cpu_ticks(str(stat))
    assert after == (85, 1800)
    assert machine.steal_share(before, after) == pytest.approx(50 / 800)
    assert machine.steal_share(None, after) is None
    assert machine.steal_share(after, after) is None  # no time passed
    stat.write_text("intr 1 2 3\n")
    assert machine.cpu_ticks(str(stat)) is None
    assert machine.cpu_ticks(str(tmp_path / "absent")) is None
    assert "Steal time over the run: 6.2%" in report.machine_line({"steal_share": 0.0625})


def test_machine_steadiness_counts_slow_windows_and_their_runs() -> None:
    # 20 windows of 10 ms; the median is 100 units; three windows under 50 form two runs.
    counts = [100] * 20
    counts[3] = 49
    counts[10] = counts[11] = 10
    counts[12] = 50  # half the median is not slow
    found = hiccups.summarize(counts)
    assert found["median_units"] == 100
    assert found["slow_share"] == pytest.approx(3 / 20)
    assert found["longest_slow_ms"] == pytest.approx(20.0)
    assert found["slow_runs_per_s"] == pytest.approx(2 / 0.2)
    steady = hiccups.summarize([7] * 50)
    assert steady["slow_share"] == 0
    assert steady["longest_slow_ms"] == 0
    assert steady["slow_runs_per_s"] == 0
    with pytest.raises(ValueError, match="no window"):
        hiccups.summarize([])


def test_a_compute_loop_counts_units_in_every_window() -> None:
    counts = hiccups.units_per_window(0.05, window_s=0.01)
    assert len(counts) == 5
    assert all(count > 0 for count in counts)


def _measured(label: str, per_second: float | None) -> Measured:
    """A finished run of 1,000 records at ``per_second`` (None: nothing processed yet
    and no rate, as an unfinished run whose first commit covered everything)."""
    if per_second is None:
        progress = Progress(1000, series=[(0.0, 1000.0)], source_series=[(0.0, 1000)])
        return Measured(label, progress, None)
    end = 1000 / per_second
    progress = Progress(
        1000,
        series=[(0.0, 0.0), (end, 1000.0)],
        source_series=[(0.0, 0), (0.0, 1), (end, 1000)],
        finished=True,
    )
    return Measured(label, progress, None)


def test_inventory_rounds_compare_the_fastest_run_of_each_kind() -> None:
    slow, fast, unrated = _measured("a", 100.0), _measured("b", 400.0), _measured("c", None)
    assert slow.rate is not None
    assert fast.rate is not None
    assert fast.rate > slow.rate
    assert inventory.fastest([slow, None, fast]) is fast
    assert inventory.fastest([None, unrated]) is unrated
    assert inventory.fastest([unrated, slow]) is slow
    assert inventory.fastest([None, None]) is None
    note = inventory.rounds_note([[slow, fast, None, unrated], [fast, slow, slow, None]])
    assert note.startswith("2 rounds")
    assert f"the project, at_least_once {slow.rate:,.0f}, {fast.rate:,.0f}" in note
    assert "Kafka Streams, at_least_once n/a," in note
    assert "Kafka Streams, exactly_once_v2 n/a, n/a" in note
    assert inventory.rounds_note([[slow, fast, slow, fast]]).startswith("One round")
