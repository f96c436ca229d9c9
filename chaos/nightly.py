"""The nightly job against a scenario's topics: does it find exactly what is wrong?"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson

from chaos.compare import Drift
from tests.support.kafka import ROOT, LocalKafka

#: The nightly job's table names, and the name of the same table in a Drift.
COMPARED = ("word_counts", "inventory", "sales_by_category")


def batch_report(kafka: LocalKafka, out: Path, measured: Drift) -> dict[str, Any]:
    """Run ``python -m jobs.recompute`` on the topics; per table, the keys it reports
    differing next to the keys the chaos comparison measured wrong."""
    if importlib.util.find_spec("pyspark") is None:
        return {"ran": False, "why": "pyspark is not installed"}
    started = time.monotonic()
    command = [
        *(sys.executable, "-m", "jobs.recompute", "--bootstrap", kafka.bootstrap),
        *("--out", str(out), "--settle-timeout", "60"),
    ]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=1200)
    seconds = round(time.monotonic() - started, 1)
    report_path = out / "report.json"
    if done.returncode not in (0, 3) or not report_path.exists():
        tail = (done.stderr or done.stdout)[-400:]
        return {"ran": False, "why": f"exit {done.returncode}: {tail}", "seconds": seconds}
    report = orjson.loads(report_path.read_bytes())
    found = {name: _differing(report["tables"][name]) for name in COMPARED}
    return {
        "ran": True,
        "exit": done.returncode,
        "seconds": seconds,
        "cut_settled": report["cut_settled"],
        "keys_differing": found,
        "keys_wrong_measured": {name: measured.tables[name].keys_wrong for name in COMPARED},
    }


def _differing(entry: dict[str, Any]) -> int:
    return int(entry["mismatched"] + entry["missing_in_stream"] + entry["missing_in_batch"])
