"""The nightly job against a scenario's topics: does it find exactly the keys that are wrong?"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson

from chaos.compare import Drift, TableDrift
from tests.support.kafka import ROOT, LocalKafka

#: The nightly job's table names, and the name of the same table in a Drift.
COMPARED = ("word_counts", "inventory", "sales_by_category")
#: Examples the job is asked for per table: enough to list every differing key.
EVERY_KEY = 10_000_000


def batch_report(kafka: LocalKafka, out: Path, measured: Drift) -> dict[str, Any]:
    """Run ``python -m jobs.recompute`` on the topics; per table, the keys it reports
    differing against the keys the chaos comparison measured wrong."""
    if importlib.util.find_spec("pyspark") is None:
        return {"ran": False, "why": "pyspark is not installed"}
    started = time.monotonic()
    command = [
        *(sys.executable, "-m", "jobs.recompute", "--bootstrap", kafka.bootstrap),
        *("--out", str(out), "--settle-timeout", "60", "--examples", str(EVERY_KEY)),
    ]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=1200)
    seconds = round(time.monotonic() - started, 1)
    report_path = out / "report.json"
    if done.returncode not in (0, 3) or not report_path.exists():
        tail = (done.stderr or done.stdout)[-400:]
        return {"ran": False, "why": f"exit {done.returncode}: {tail}", "seconds": seconds}
    report = orjson.loads(report_path.read_bytes())
    return {
        "ran": True,
        "exit": done.returncode,
        "seconds": seconds,
        "cut_settled": report["cut_settled"],
        **cross_check(report["tables"], measured.tables),
    }


def cross_check(reported: Mapping[str, Any], measured: Mapping[str, TableDrift]) -> dict[str, Any]:
    """Per table, the keys the job reported differing against the keys measured wrong:
    how many of each, a few that only one side names, and whether they are the same
    keys. A report whose examples do not list every differing key cannot be checked."""
    found = {name: differing_keys(reported[name]) for name in COMPARED}
    wrong = {name: wrong_keys(name, measured[name]) for name in COMPARED}
    listed = all(found[name] is not None for name in COMPARED)
    return {
        "keys_differing": {n: _count(found[n]) for n in COMPARED},
        "keys_wrong_measured": {n: len(wrong[n]) for n in COMPARED},
        "only_in_the_report": {n: sorted((found[n] or set()) - wrong[n])[:5] for n in COMPARED},
        "only_measured": {n: sorted(wrong[n] - (found[n] or set()))[:5] for n in COMPARED},
        "every_key_listed": listed,
        "same_keys": listed and all(found[n] == wrong[n] for n in COMPARED),
    }


def _count(keys: set[str] | None) -> int | None:
    return None if keys is None else len(keys)


def differing_keys(entry: Mapping[str, Any]) -> set[str] | None:
    """The keys a table's report entry lists as differing; None when it lists fewer
    than it counts."""
    keys = {named(example["key"], example.get("window")) for example in entry["examples"]}
    counted = entry["mismatched"] + entry["missing_in_stream"] + entry["missing_in_batch"]
    return keys if len(keys) == counted else None


def named(key: Any, window: Mapping[str, Any] | None) -> str:
    """A key as the cross-check names it: ``key@start`` for a window's."""
    return str(key) if window is None else f"{key}@{window['start']}"


def wrong_keys(table: str, drift: TableDrift) -> set[str]:
    """The keys measured wrong, named as :func:`named` names the report's."""
    if table == "sales_by_category":
        return {named(category, {"start": start}) for category, start in drift.wrong_keys}
    return {str(key) for key in drift.wrong_keys}
