"""chaos/results/summary.json and summary.md from the scenarios' results."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from pathlib import Path
from typing import Any

from ops.generated import README, ROOT, replace_section

RESULTS = Path(__file__).resolve().parent / "results"


def machine() -> dict[str, Any]:
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
        ).stdout.strip()
    except OSError:
        commit = ""
    return {
        "cpus": os.cpu_count(),
        "load_average_1m": round(os.getloadavg()[0], 1),
        "python": platform.python_version(),
        "commit": commit,
    }


def previous(directory: Path = RESULTS) -> dict[str, Any]:
    """The scenarios of the last summary.json, if there is one."""
    try:
        scenarios: dict[str, Any] = json.loads((directory / "summary.json").read_text())[
            "scenarios"
        ]
    except (OSError, ValueError, KeyError):
        return {}
    return scenarios


def write(results: dict[str, Any], mode: str, directory: Path = RESULTS) -> Path:
    """Write both files; return the path of summary.md."""
    directory.mkdir(parents=True, exist_ok=True)
    document = {
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "mode": mode,
        "machine": machine(),
        "scenarios": results,
    }
    (directory / "summary.json").write_text(json.dumps(document, indent=2, default=str) + "\n")
    path = directory / "summary.md"
    path.write_text(markdown(document))
    if directory == RESULTS:  # the project's own results: the docs follow them
        publish(document)
    return path


def headline(document: dict[str, Any]) -> str:
    """The README's reliability table: each scenario's verdict and headline."""
    m = document["machine"]
    lines = [
        f"`make chaos` at commit `{m['commit']}` ({document['mode']} run, "
        f"{document['generated_at']}, {m['cpus']} cores):",
        "",
        "| fault | verdict | what happened |",
        "| --- | --- | --- |",
    ]
    for result in document["scenarios"].values():
        lines.append(f"| {result['title']} | {result['verdict']} | {result['headline']} |")
    return "\n".join(lines) + "\n"


def publish(document: dict[str, Any]) -> None:
    """docs/reliability.md and the README's reliability table, from ``document``."""
    (ROOT / "docs" / "reliability.md").write_text(markdown(document))
    replace_section(README, "reliability", headline(document))


def markdown(document: dict[str, Any]) -> str:
    m = document["machine"]
    lines = [
        "# Reliability: chaos suite results",
        "",
        f"Run {document['generated_at']} ({document['mode']} run), commit {m['commit']}, "
        f"{m['cpus']} cores, load average {m['load_average_1m']} at the end; every process "
        "on loopback. Produced by `make chaos` (`python -m chaos`).",
        "",
        "| scenario | verdict | figures |",
        "| --- | --- | --- |",
    ]
    scenarios: dict[str, Any] = document["scenarios"]
    for result in scenarios.values():
        lines.append(f"| {result['title']} | {result['verdict']} | {result['headline']} |")
    for result in scenarios.values():
        lines += ["", f"## {result['title']}", "", result["how"], ""]
        lines += [f"- [{'x' if c['ok'] else ' '}] {c['check']}"
                  for c in result["checks"]]  # fmt: skip
        if result.get("error"):
            lines += ["", f"The scenario did not finish: `{result['error']}`"]
        figures = result.get("figures") or {}
        rounds = figures.get("rounds")
        if rounds:
            lines += ["", *_table(rounds)]
        scalars = {k: v for k, v in figures.items() if k != "rounds"}
        if scalars:
            lines += ["", "```json", json.dumps(scalars, indent=1, default=str), "```"]
        for note in result.get("notes", []):
            lines += ["", note]
    return "\n".join(lines) + "\n"


def _table(rows: list[dict[str, Any]]) -> list[str]:
    columns = list(rows[0])
    out = ["| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
    out += ["| " + " | ".join(str(row.get(c, "")) for c in columns) + " |" for row in rows]
    return out
