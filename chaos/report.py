"""chaos/results/summary.json and summary.md from the scenarios' results."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from pathlib import Path
from statistics import median
from typing import Any

from chaos.load import LoadLevel
from ops.generated import README, ROOT, replace_section

RESULTS = Path(__file__).resolve().parent / "results"


def _git(*args: str) -> str:
    try:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
    except OSError:
        return ""
    return done.stdout.strip()


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def machine() -> dict[str, Any]:
    """The machine and the code a run measures (taken at its start)."""
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {
        "cpus": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "memory_gib": round(memory, 1),
        "os": platform.platform(),
        "python": platform.python_version(),
        "commit": _git("rev-parse", "--short", "HEAD"),
        "uncommitted_changes": [line[3:] for line in _git("status", "--porcelain").splitlines()],
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "load_average_start": [round(x, 2) for x in os.getloadavg()],
    }


def previous(directory: Path = RESULTS) -> dict[str, Any]:
    """The scenarios of the last summary.json, if there is one."""
    try:
        document = json.loads((directory / "summary.json").read_text())
        scenarios: dict[str, Any] = document["scenarios"]
        measured = {"commit": document["machine"]["commit"], "at": document["generated_at"]}
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    for result in scenarios.values():
        result.setdefault("measured", measured)
    return scenarios


def earlier(document: dict[str, Any]) -> list[str]:
    """The scenarios of ``document`` that an earlier run measured, as "name (commit c, at
    time)": a partial run (``--only``) keeps the others' latest results."""
    ran = set(document["run"]["scenarios_run"])
    return [
        f"{name} (commit {result['measured']['commit']}, {result['measured']['at']})"
        for name, result in document["scenarios"].items()
        if name not in ran
    ]


def load_figures(level: LoadLevel, results: dict[str, Any]) -> dict[str, Any]:
    """The run's level, and per loaded scenario what its group sustained (when the level
    was calibrated), what was offered over wall time, how long the generator stalled,
    and what was processed."""
    per: dict[str, Any] = {}
    for name, result in results.items():
        figures = result.get("figures") or {}
        load = figures.get("load")
        if not load or "offered_lines_per_s" not in load:
            continue
        rounds = figures.get("rounds") or []
        calibration = load.get("calibration") or {}
        per[name] = {
            "sustained_lines_per_s": calibration.get("sustained_lines_per_s"),
            "sustained_events_per_s": calibration.get("sustained_events_per_s"),
            "offered_lines_per_s": load["offered_lines_per_s"],
            "offered_events_per_s": load["offered_events_per_s"],
            "offered_payments_per_s": load["offered_payments_per_s"],
            "generator_stalled_s": load.get("stalled_s"),
            "processed_lines_per_s": _median(rounds, "processed_lines_per_s")
            or figures.get("processed_lines_per_s_while_down"),
            "processed_events_per_s": _median(rounds, "processed_events_per_s")
            or figures.get("processed_events_per_s_while_down"),
            "peak_lag": max((r["peak_lag"] or 0 for r in rounds), default=None)
            or figures.get("peak_lag"),
            "drain_after_pause_s": _median(rounds, "drain_after_pause_s")
            or figures.get("drain_after_pause_s"),
        }
    return {**level.as_dict(), "scenarios": per}


def offering(load: dict[str, Any]) -> str:
    """The run's load in one phrase."""
    rates = f"{load['lines_per_s']:,.0f} text lines/s and {load['events_per_s']:,.0f} item events/s"
    share = load.get("share_of_sustained")
    if share is None:
        return f"offering {rates} ({load['source']})"
    return (
        f"offering each loaded scenario's group {share:.0%} of what it sustained in a "
        f"calibration phase of the same run, which offered {rates} ({load['source']})"
    )


def _median(rows: list[dict[str, Any]], key: str) -> float | None:
    found = [r[key] for r in rows if r.get(key) is not None]
    return round(median(found), 1) if found else None


def write(
    results: dict[str, Any],
    mode: str,
    machine_figures: dict[str, Any],
    level: LoadLevel,
    run: dict[str, Any],
    directory: Path = RESULTS,
) -> Path:
    """Write both files; return the path of summary.md. The scenarios this run ran
    (``run["scenarios_run"]``) are marked as measured by it."""
    directory.mkdir(parents=True, exist_ok=True)
    generated_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    for name in run["scenarios_run"]:
        results[name]["measured"] = {"commit": machine_figures["commit"], "at": generated_at}
    document = {
        "generated_at": generated_at,
        "mode": mode,
        "machine": {
            **machine_figures,
            "load_average_end": [round(x, 2) for x in os.getloadavg()],
        },
        "run": run,
        "load": load_figures(level, results),
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
    m, load = document["machine"], document["load"]
    older = earlier(document)
    n = len(older)
    kept = (
        f"; {n} scenario{'s' * (n != 1)} from earlier runs, as "
        "[docs/reliability.md](docs/reliability.md) says"
    ) * bool(n)
    lines = [
        f"`make chaos` at commit `{m['commit']}` ({document['mode']} run, "
        f"{document['generated_at']}, {m['cpus']} cores, {document['run']['seconds'] // 60} "
        f"min{kept}), {offering(load)}:",
        "",
        "| fault | verdict | what happened |",
        "| --- | --- | --- |",
    ]
    for title, verdict, what in paired(list(document["scenarios"].values())):
        lines.append(f"| {title} | {verdict} | {what} |")
    return "\n".join(lines) + "\n"


GUARANTEES = (", exactly_once", ", at_least_once")


def paired(results: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """(title, verdict, headline) per row: a scenario run under both guarantees is one
    row, each guarantee's verdict and headline named."""
    rows: list[tuple[str, str, str]] = []
    by_title = {r["title"]: r for r in results}
    done: set[str] = set()
    for result in results:
        title = result["title"]
        if title in done:
            continue
        eos, alo = GUARANTEES
        base = title.removesuffix(eos)
        other = by_title.get(base + alo) if title.endswith(eos) else None
        if other is None:
            rows.append((title, result["verdict"], result["headline"]))
            continue
        done.add(other["title"])
        verdicts = {result["verdict"], other["verdict"]}
        verdict = (
            result["verdict"]
            if len(verdicts) == 1
            else (f"exactly_once {result['verdict']}, at_least_once {other['verdict']}")
        )
        what = f"exactly_once: {result['headline']}; at_least_once: {other['headline']}"
        rows.append((f"{base}, both guarantees", verdict, what))
    return rows


def publish(document: dict[str, Any]) -> None:
    """docs/reliability.md and the README's reliability table, from ``document``."""
    (ROOT / "docs" / "reliability.md").write_text(markdown(document))
    replace_section(README, "reliability", headline(document))


def markdown(document: dict[str, Any]) -> str:
    m = document["machine"]
    lines = [
        "# Reliability: chaos suite results",
        "",
        f"Run {document['generated_at']} ({document['mode']} run, {document['run']['seconds']} s),"
        f" commit {m['commit']}{' with uncommitted changes' if m['uncommitted_changes'] else ''},"
        f" {m['cpus']} cores ({m['cpu_model']}), {m['memory_gib']} GiB, load average "
        f"{m['load_average_start']} at the start and {m['load_average_end']} at the end (the "
        "machine is shared); every process on loopback. Produced by `make chaos` "
        "(`python -m chaos`).",
        *(
            ["", f"A partial run: the results of {'; '.join(older)} come from earlier runs."]
            if (older := earlier(document))
            else []
        ),
        "",
        *_load_section(document["load"]),
        "",
        "| scenario | verdict | figures |",
        "| --- | --- | --- |",
    ]
    scenarios: dict[str, Any] = document["scenarios"]
    for result in scenarios.values():
        lines.append(f"| {result['title']} | {result['verdict']} | {result['headline']} |")
    for result in scenarios.values():
        lines += _scenario_section(result)
    return "\n".join(lines) + "\n"


#: The columns of the load table (a run before the calibration has no sustained rates
#: and no stalls: those cells stay empty).
LOAD_COLUMNS = (
    "sustained_lines_per_s",
    "sustained_events_per_s",
    "offered_lines_per_s",
    "offered_events_per_s",
    "offered_payments_per_s",
    "generator_stalled_s",
    "processed_lines_per_s",
    "processed_events_per_s",
    "peak_lag",
    "drain_after_pause_s",
)


def _load_section(load: dict[str, Any]) -> list[str]:
    lines = [
        f"Load: {offering(load)}; text lines and item events at the same time, with "
        "payments for about half of the sales. The calibration offers those rates for a "
        "few seconds and times the group until it has processed all of it (lag 0): what "
        "it sustains. Offered rates are the records the brokers acknowledged over the "
        "wall time the generator was asked to offer, its stalls included (a stall: more "
        "than 1 s between two of its ticks; the time beyond 1 s is not offered at all). "
        "Processed rates are the group's committed offsets over the loaded stretches (the "
        "median round); lag is records not yet committed over every topic the group "
        "reads; the drain is the time from the pause of the load to lag 0.",
        "",
        "| scenario | sustained lines/s | sustained events/s | offered lines/s | "
        "offered events/s | payments/s | generator stalled (s) | processed lines/s | "
        "processed events/s | peak lag | drain after pause (s) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, row in load["scenarios"].items():
        cells = [row.get(column) for column in LOAD_COLUMNS]
        lines.append(f"| {name} | " + " | ".join(_cell(c) for c in cells) + " |")
    return lines


def _cell(value: Any) -> str:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return f"{value:,.0f}" if abs(value) >= 100 else f"{value:g}"
    return "" if value is None else str(value)


def _scenario_section(result: dict[str, Any]) -> list[str]:
    lines = ["", f"## {result['title']}", "", result["how"], ""]
    lines += [
        f"- [{'x' if c['ok'] else ' '}] {c['check']}{' (target)' if c.get('target') else ''}"
        for c in result["checks"]
    ]
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
    return lines


def _table(rows: list[dict[str, Any]]) -> list[str]:
    columns = [c for c in rows[0] if not isinstance(rows[0][c], list | dict)]
    out = ["| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
    out += ["| " + " | ".join(_cell(row.get(c)) for c in columns) + " |" for row in rows]
    return out
