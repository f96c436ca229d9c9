"""The last nightly reconciliation report, for the console's Nightly view.

The nightly scheduler (``ops/nightly.py``) writes each run's ``report.json`` to a folder
of its own under its output root; a worker reads the newest one under
``STREAMSTATE_NIGHTLY_REPORTS`` (that root, a run's folder, or a report file). The
report's figures per table (``jobs/recompute.py``): keys compared, mismatched, missing on
either side, and the corrections published by ``--repair``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

REPORT = "report.json"
#: The report's counts of keys that differ, per table.
DIFFERENCES = ("mismatched", "missing_in_stream", "missing_in_batch")


def newest_report(place: Path) -> Path | None:
    """The newest report at ``place``: the file itself, its ``report.json``, or the
    newest ``*/report.json`` under it."""
    if place.is_file():
        return place
    if (place / REPORT).is_file():
        return place / REPORT
    runs = [p for p in place.glob(f"*/{REPORT}") if p.is_file()] if place.is_dir() else []
    return max(runs, key=lambda p: (p.stat().st_mtime, p.parent.name), default=None)


def table_entry(name: str, entry: Any) -> dict[str, Any]:
    """One table's line of the view."""
    if not isinstance(entry, dict) or "keys_compared" not in entry:
        return {"name": name, "recomputed": False}
    counts = {k: int(entry.get(k) or 0) for k in DIFFERENCES}
    return {
        "name": name,
        "recomputed": True,
        "keys_compared": int(entry["keys_compared"]),
        "differing": sum(counts.values()),
        **counts,
        "repaired": int(entry.get("corrections_published") or 0),
        "examples": list(entry.get("examples") or [])[:10],
    }


def summarize(path: Path, report: dict[str, Any]) -> dict[str, Any]:
    """The view's figures of one report."""
    tables = report.get("tables") or {}
    entries = [table_entry(name, entry) for name, entry in sorted(tables.items())]
    entries += [
        {"name": name, "recomputed": False}
        for name in report.get("not_recomputed") or ()
        if name not in tables
    ]
    written = path.stat().st_mtime
    return {
        "path": str(path),
        "ran_at": report.get("cut_taken_at_ms") or round(written * 1000),
        "written_at": round(written * 1000),
        "seconds": report.get("seconds"),
        "differs": any(e.get("differing") for e in entries),
        "cut_settled": report.get("cut_settled"),
        "group_lag": report.get("group_lag"),
        "corrections_published": int(report.get("corrections_published") or 0),
        "tables": entries,
    }


class NightlyReports:
    """Reads the newest report when it changed since the last request."""

    def __init__(self, place: Path) -> None:
        self.place = place
        self._seen: tuple[Path, float, int] | None = None
        self._summary: dict[str, Any] | None = None

    def latest(self) -> dict[str, Any]:
        """``{"looked_in", "report": summary or None, "detail": why there is none}``."""
        path = newest_report(self.place)
        if path is None:
            detail = f"no {REPORT} under {self.place} yet (make nightly writes one)"
            return {"looked_in": str(self.place), "report": None, "detail": detail}
        stat = path.stat()
        seen = (path, stat.st_mtime, stat.st_size)
        if seen != self._seen:
            try:
                report = orjson.loads(path.read_bytes())
            except (OSError, orjson.JSONDecodeError) as error:
                detail = f"{path} cannot be read: {error}"
                return {"looked_in": str(self.place), "report": None, "detail": detail}
            if not isinstance(report, dict) or not isinstance(report.get("tables"), dict):
                detail = (
                    f"{path} is not a nightly report: a JSON object with its tables is expected"
                )
                return {"looked_in": str(self.place), "report": None, "detail": detail}
            self._summary = summarize(path, report)
            self._seen = seen
        return {"looked_in": str(self.place), "report": self._summary, "detail": None}
