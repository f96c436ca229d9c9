"""The recompute's pure parts: the cut's JSON, window horizons, the settings it takes, the
summary, the scheduler."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pytest

from core.settings import Settings
from jobs.cut import Cut
from jobs.declared import declare
from jobs.recompute import (
    EXPIRY_MARGIN_MS,
    LIVE_POOL,
    RECOMPUTE_POOL,
    Options,
    horizons,
    parse_args,
    summary,
)
from jobs.session import SCHEDULER_POOLS
from ops.nightly import Scheduler, next_run, prune
from ops.nightly import parse_args as nightly_args

DAY = 86_400_000


def test_cut_json_names_every_topic_and_partition_as_strings() -> None:
    cut = Cut(
        sources={"text-lines": {0: 5, 1: 0}},
        changelogs={"streamstate-word_counts-changelog": {0: 9}},
        log_start={},
        taken_at_ms=0,
        settled=True,
    )
    assert cut.as_json() == {
        "text-lines": {"0": 5, "1": 0},
        "streamstate-word_counts-changelog": {"0": 9},
    }


def test_each_windowed_table_is_compared_from_its_own_retention_before_the_cut() -> None:
    options = Options(
        bootstrap="b:1",
        out=Path("x"),
        modules=("agents.sales", "tests.support.pipelines"),
        window_retention_ms=7 * DAY,
    )
    declared = declare(options.spec(2, 0))
    cut = Cut(sources={}, changelogs={}, log_start={}, taken_at_ms=10 * DAY, settled=True)
    # Tables without windows have no horizon; every window here keeps the default.
    assert horizons(options, declared, cut) == {
        "sales_by_category": 3 * DAY + EXPIRY_MARGIN_MS,
        "views_per_user": 3 * DAY + EXPIRY_MARGIN_MS,
        "seconds_by_country": 3 * DAY + EXPIRY_MARGIN_MS,
        "sessions": 3 * DAY + EXPIRY_MARGIN_MS,
    }


def entry(mismatched: int = 0) -> dict[str, Any]:
    return {
        "keys_compared": 3,
        "mismatched": mismatched,
        "missing_in_stream": 0,
        "missing_in_batch": 0,
        "examples": [{"key": "fox", "status": "mismatched", "batch": 1, "stream": 2}]
        if mismatched
        else [],
        "recompute": {"pipelines": ["p"], "how": "folded", "order_dependent": None},
    }


def report(**tables: dict[str, Any]) -> dict[str, Any]:
    return {
        "cut": {"text-lines": {"0": 4}},
        "tables": tables,
        "cut_settled": False,
        "group_lag": {"text-lines": 2},
        "log_start": {},
        "corrections_published": 0,
        "not_recomputed": [],
    }


def test_summary_names_counts_examples_lag_and_result() -> None:
    text = summary(report(word_counts=entry(1), inventory=entry()))
    assert "word_counts" in text
    assert "mismatched: 'fox' batch=1 stream=2" in text
    assert "had not caught up" in text
    assert "DIFFERENCES FOUND (exit 3)" in text
    assert "no differences (exit 0)" in summary(report(inventory=entry()))


def test_summary_names_the_window_of_a_windowed_example() -> None:
    windowed = entry(1)
    windowed["examples"][0]["window"] = {"start": 3_600_000, "end": 7_200_000}
    text = summary(report(per_hour=windowed))
    assert "mismatched: 'fox' window [3600000, 7200000) batch=1 stream=2" in text


def test_summary_names_tables_not_recomputed_and_why_others_may_differ() -> None:
    found = report(firsts=entry())
    found["tables"]["firsts"]["recompute"]["order_dependent"] = "folds values as they interleave"
    found["not_recomputed"] = [{"table": "balances", "pipeline": "b", "reason": "no recompute"}]
    text = summary(found)
    assert "may differ without an error: folds values as they interleave" in text
    assert "NOT RECOMPUTED: balances (b): no recompute" in text


def test_the_pipeline_modules_and_limits_come_from_the_workers_settings() -> None:
    settings = Settings(
        pipelines="agents.words", extra_pipelines="acme.views, agents.words", max_event_bytes=99
    )
    options = parse_args(["--out", "x"], settings)
    assert options.modules == ("agents.words", "acme.views")
    assert (options.max_event_bytes, options.window_retention_ms) == (99, 7 * DAY)
    assert parse_args(["--out", "x"], Settings()).modules == (
        "agents.words",
        "agents.inventory",
        "agents.sales",
        "agents.settling",
    )


def test_command_line_defaults_to_a_local_master() -> None:
    options = parse_args(["--out", "x", "--bootstrap", "b:1"])
    assert (options.master, options.bootstrap, options.repair) == ("local[*]", "b:1", False)
    assert parse_args(["--out", "x", "--repair", "--master", "local[2]"]).master == "local[2]"


def test_nightly_cron_default_runs_at_two_utc() -> None:
    after = datetime(2024, 1, 1, 3, 0, tzinfo=UTC)
    assert next_run("0 2 * * *", after) == datetime(2024, 1, 2, 2, 0, tzinfo=UTC)


def test_nightly_keeps_the_newest_runs(tmp_path: Path) -> None:
    for name in ("20240101T020000Z", "20240102T020000Z", "20240103T020000Z"):
        (tmp_path / name).mkdir()
    prune(tmp_path, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["20240102T020000Z", "20240103T020000Z"]


def test_nightly_runs_the_job_with_its_options(tmp_path: Path) -> None:
    args = argparse.Namespace(
        bootstrap="k:9092", repair=True, master="spark://m:7077", out_root=tmp_path, views_root=None
    )
    command = Scheduler(args).command(tmp_path / "run")
    assert command[1:] == [
        "-m",
        "jobs.recompute",
        "--bootstrap",
        "k:9092",
        "--out",
        str(tmp_path / "run"),
        "--repair",
        "--master",
        "spark://m:7077",
    ]


def test_nightly_places_each_runs_views_under_the_views_root(tmp_path: Path) -> None:
    args = nightly_args(["--views-root", "hdfs://nn/streamstate/", "--out-root", str(tmp_path)])
    command = Scheduler(args).command(tmp_path / "20240101T020000Z")
    assert command[-2:] == ["--views", "hdfs://nn/streamstate/20240101T020000Z"]
    assert "--views" not in Scheduler(nightly_args([])).command(tmp_path / "run")


def test_nightly_takes_the_master_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STREAMSTATE_SPARK_MASTER", raising=False)
    assert nightly_args([]).master == "local[*]"
    monkeypatch.setenv("STREAMSTATE_SPARK_MASTER", "spark://spark-master:7077")
    assert nightly_args([]).master == "spark://spark-master:7077"
    assert nightly_args(["--master", "yarn"]).master == "yarn"


def test_every_scheduler_pool_of_the_job_is_declared_in_the_allocation_file() -> None:
    root = ElementTree.parse(SCHEDULER_POOLS).getroot()
    declared = {pool.get("name") for pool in root.iter("pool")}
    used = {RECOMPUTE_POOL, LIVE_POOL}
    assert declared == used
    for pool in root.iter("pool"):
        assert pool.findtext("schedulingMode") in {"FIFO", "FAIR"}
        assert int(pool.findtext("weight") or "") >= 1


def test_stage_zero_coalesces_only_the_partitions_where_two_ordered_topics_hold_records() -> None:
    from jobs.stages import source_reads

    options = Options(bootstrap="b:1", out=Path("x"), modules=("agents.words", "agents.settling"))
    declared = declare(options.spec(3, 0))
    cut = Cut(
        sources={
            "item-events": {0: 5, 1: 7, 2: 0},
            "payments": {0: 0, 1: 2, 2: 0},
            "text-lines": {0: 4, 1: 0, 2: 9},
        },
        changelogs={},
        log_start={},
        taken_at_ms=0,
        settled=True,
    )
    reads = source_reads(cut, declared)
    assert reads.coalesced == [{"item-events": {1: 7}, "payments": {1: 2}}]
    assert reads.alone == {"item-events": {0: 5}}
    assert reads.chunks == {"text-lines": {0: 4, 1: 0, 2: 9}}
