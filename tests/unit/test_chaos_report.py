"""The chaos report says which run measured each scenario."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from chaos import report
from chaos.load import LoadLevel


def scenario(title: str, commit: str) -> dict[str, Any]:
    at = "2026-11-26T00:00:00Z"
    return {
        "title": title,
        "verdict": "pass",
        "headline": "ok",
        "measured": {"commit": commit, "at": at},
    }


def document(scenarios: dict[str, Any], ran: list[str], mode: str) -> dict[str, Any]:
    return {
        "generated_at": "2026-11-26T01:00:00Z",
        "mode": mode,
        "machine": {"commit": "new1234", "cpus": 2},
        "load": {"lines_per_s": 10.0, "events_per_s": 5.0, "source": "test"},
        "run": {"seconds": 120, "scenarios_run": ran},
        "scenarios": scenarios,
    }


def test_a_partial_run_names_the_scenarios_an_earlier_run_measured() -> None:
    doc = document(
        {"kill": scenario("kill", "new1234"), "outage": scenario("outage", "old5678")},
        ["kill"],
        "partial",
    )
    assert report.earlier(doc) == ["outage (commit old5678, 2026-11-26T00:00:00Z)"]
    text = report.headline(doc)
    assert "(partial run," in text
    assert "; 1 scenario from earlier runs" in text


def test_a_full_run_names_no_earlier_scenario() -> None:
    doc = document({"kill": scenario("kill", "new1234")}, ["kill"], "full")
    assert report.earlier(doc) == []
    assert "earlier" not in report.headline(doc)


def test_previous_results_keep_the_commit_that_measured_them(tmp_path: Path) -> None:
    old = document({"outage": {"title": "outage", "verdict": "pass", "headline": "ok"}}, [], "full")
    old["machine"]["commit"] = "old5678"
    (tmp_path / "summary.json").write_text(json.dumps(old))
    found = report.previous(tmp_path)
    assert found["outage"]["measured"] == {"commit": "old5678", "at": "2026-11-26T01:00:00Z"}
    assert report.previous(tmp_path / "missing") == {}


def test_a_partial_run_marks_what_it_ran_and_keeps_the_rest(tmp_path: Path) -> None:
    def result(title: str) -> dict[str, Any]:
        return {"title": title, "verdict": "pass", "headline": "ok", "how": "how", "checks": []}

    old = result("outage")
    old["measured"] = {"commit": "old5678", "at": "2026-11-26T00:00:00Z"}
    machine = {
        "commit": "new1234",
        "uncommitted_changes": [],
        "cpus": 2,
        "cpu_model": "cpu",
        "memory_gib": 1,
        "load_average_start": [0.0, 0.0, 0.0],
    }
    run = {"seconds": 60, "scenarios_run": ["kill"]}
    level = LoadLevel(10.0, 5.0, "test")
    report.write({"kill": result("kill"), "outage": old}, "partial", machine, level, run, tmp_path)
    written = json.loads((tmp_path / "summary.json").read_text())
    assert written["scenarios"]["kill"]["measured"]["commit"] == "new1234"
    assert written["scenarios"]["outage"]["measured"]["commit"] == "old5678"
    text = (tmp_path / "summary.md").read_text()
    assert "(partial run, 60 s)" in text
    assert "A partial run: the results of outage (commit old5678" in text


def test_a_scenario_under_both_guarantees_is_one_row_of_the_readme() -> None:
    def result(title: str, verdict: str, headline: str) -> dict[str, Any]:
        return {"title": title, "verdict": verdict, "headline": headline}

    rows = report.paired(
        [
            result("kill, exactly_once", "pass", "a"),
            result("kill, at_least_once", "target missed", "b"),
            result("outage", "pass", "c"),
            result("disk, exactly_once", "pass", "d"),
            result("disk, at_least_once", "pass", "e"),
            result("lonely, exactly_once", "pass", "f"),
        ]
    )
    assert rows == [
        (
            "kill, both guarantees",
            "exactly_once pass, at_least_once target missed",
            "exactly_once: a; at_least_once: b",
        ),
        ("outage", "pass", "c"),
        ("disk, both guarantees", "pass", "exactly_once: d; at_least_once: e"),
        ("lonely, exactly_once", "pass", "f"),
    ]
