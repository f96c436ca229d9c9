"""summary.json, summary.md and the plots of a run."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from bench.config import RESULTS
from ops.generated import README, ROOT, replace_section

#: The sections and keys of summary.json, in order (the issue's schema).
KSTREAMS = (
    "baseline_kstreams_events_per_s",
    "baseline_kstreams_eos_events_per_s",
    "peak_rss_mib",
    "baseline_kstreams_peak_rss_mib",
    "kstreams_tables_equal",
)
SCHEMA: dict[str, tuple[str, ...]] = {
    "wordcount": (
        "events_per_s",
        "eos_events_per_s",
        "console_events_per_s",
        "baseline_faust_events_per_s",
        "ceiling_aiokafka_events_per_s",
        *KSTREAMS,
    ),
    "inventory": (
        "events_per_s",
        "eos_events_per_s",
        "ceiling_consume_parse_events_per_s",
        *KSTREAMS,
    ),
    "iq": (
        "local_rps",
        "local_p99_ms",
        "routed_rps",
        "routed_p99_ms",
        "load_generator",
        "standby_catch_up_s",
        "standby_records",
        "machine_slow_pct",
        "machine_longest_slow_ms",
    ),
    "consistency": (
        "ryw_p50_ms",
        "ryw_p99_ms",
        "ryw_words_p50_ms",
        "ryw_words_p99_ms",
        "plain_read_rps",
        "token_read_rps",
    ),
    "restore": ("records_per_s", "restart_ready_s", "keys", "peak_rss_mib"),
    "failover": ("seconds_to_active", "failed_reads"),
    "batch": ("recompute_s", "cluster_recompute_s", "scan_s", "events"),
}


@dataclass(frozen=True)
class Row:
    """One line of the summary table: a figure, and what it is held against."""

    section: str
    key: str
    label: str
    unit: str
    #: The figure this one is divided by (same section), or None to divide by ``target``.
    base: str | None = None
    target: float | None = None
    #: ">=": the ratio (or value) must reach the target; "<=": must not exceed it; "yes":
    #: a check that must hold.
    direction: str = ">="


FAUST, CEILING = "baseline_faust_events_per_s", "ceiling_aiokafka_events_per_s"
PARSE_CEILING = "ceiling_consume_parse_events_per_s"
KS, KS_EOS = "baseline_kstreams_events_per_s", "baseline_kstreams_eos_events_per_s"
EOS = "eos_events_per_s"


def kstreams_rows(section: str, unit: str, ratio: float) -> tuple[Row, ...]:
    """The rows that hold a scenario against Kafka Streams in the same run."""
    return (
        Row(section, "events_per_s", "vs Kafka Streams (at_least_once)", "", KS, ratio),
        Row(section, EOS, "exactly_once vs Kafka Streams (exactly_once_v2)", "", KS_EOS, ratio),
        Row(section, KS, "Kafka Streams, at_least_once", unit),
        Row(section, KS_EOS, "Kafka Streams, exactly_once_v2", unit),
        Row(section, "peak_rss_mib", "peak RSS, project worker", "MiB"),
        Row(section, "baseline_kstreams_peak_rss_mib", "peak RSS, Kafka Streams JVM", "MiB"),
        Row(
            section, "kstreams_tables_equal", "tables equal to Kafka Streams'", "", None, 1.0, "yes"
        ),
    )


ROWS = (
    Row("wordcount", "events_per_s", "word count, project worker", "lines/s"),
    Row("wordcount", EOS, "word count, project worker, exactly_once", "lines/s"),
    Row("wordcount", "console_events_per_s", "word count, console open", "lines/s"),
    Row(
        "wordcount",
        "console_events_per_s",
        "console open vs closed",
        "",
        "events_per_s",
        0.9,
    ),
    Row("wordcount", "events_per_s", "vs the faust baseline", "", FAUST, 5.0),
    Row("wordcount", "events_per_s", "vs the aiokafka ceiling", "", CEILING, 0.75),
    Row("wordcount", EOS, "exactly_once vs the aiokafka ceiling", "", CEILING, 0.75),
    Row("wordcount", "baseline_faust_events_per_s", "word count, faust baseline", "lines/s"),
    Row("wordcount", "ceiling_aiokafka_events_per_s", "word count, aiokafka ceiling", "lines/s"),
    *kstreams_rows("wordcount", "lines/s", 4.0),
    Row("inventory", "events_per_s", "inventory, project worker", "events/s", None, 25_000.0),
    Row("inventory", EOS, "inventory, project worker, exactly_once", "events/s"),
    Row("inventory", EOS, "exactly_once vs at_least_once", "", "events_per_s", 0.7),
    Row("inventory", "events_per_s", "vs the consume+parse ceiling", "", PARSE_CEILING, 0.12),
    Row("inventory", EOS, "exactly_once vs the consume+parse ceiling", "", PARSE_CEILING, 0.12),
    Row("inventory", PARSE_CEILING, "inventory, consume+parse ceiling", "events/s"),
    *kstreams_rows("inventory", "events/s", 2.5),
    Row("iq", "local_rps", "key reads, local", "req/s", None, 8000.0),
    Row("iq", "local_p99_ms", "key reads, local p99", "ms", None, 5.0, "<="),
    Row("iq", "routed_rps", "key reads, routed", "req/s", None, 4000.0),
    Row("iq", "routed_p99_ms", "key reads, routed p99", "ms", None, 10.0, "<="),
    Row("iq", "load_generator", "key reads measured by", ""),
    Row("iq", "standby_catch_up_s", "second worker's standbys caught up, from its start", "s"),
    Row("iq", "standby_records", "changelog records its standbys applied", "records"),
    Row("iq", "machine_slow_pct", "idle machine: 10-ms windows at under half speed", "%"),
    Row("iq", "machine_longest_slow_ms", "idle machine: longest run of slow windows", "ms"),
    Row("consistency", "ryw_p99_ms", "read your writes, p99", "ms", None, 100.0, "<="),
    Row("consistency", "ryw_p50_ms", "read your writes, p50", "ms"),
    Row("consistency", "ryw_words_p99_ms", "read your writes through a repartition, p99", "ms"),
    Row("consistency", "token_read_rps", "key reads with a token", "req/s"),
    Row(
        "consistency",
        "plain_read_rps",
        "plain reads vs reads with a token",
        "",
        "token_read_rps",
        1.2,
        "<=",
    ),
    Row("restore", "records_per_s", "full restore", "records/s", None, 150_000.0),
    Row("restore", "restart_ready_s", "restart to ready, data dir intact", "s", None, 3.0, "<="),
    Row("restore", "keys", "restored table", "keys"),
    Row("restore", "peak_rss_mib", "peak RSS, worker holding it", "MiB", None, 1024.0, "<="),
    Row("failover", "seconds_to_active", "kill -9 to all keys active", "s", None, 5.0, "<="),
    Row("failover", "failed_reads", "failed reads meanwhile", "reads"),
    Row("batch", "recompute_s", "nightly recompute", "s"),
    Row("batch", "recompute_s", "vs a bare Spark count", "", "scan_s", 2.0, "<="),
    Row("batch", "cluster_recompute_s", "nightly recompute, 2-worker standalone", "s"),
    Row("batch", "scan_s", "bare Spark count", "s"),
    Row("batch", "events", "source records", "records"),
)


def summary(machine: dict[str, Any], figures: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """summary.json: the machine and exactly the schema's keys (None when not measured)."""
    out: dict[str, Any] = {"machine": machine}
    for section, keys in SCHEMA.items():
        found = figures.get(section, {})
        out[section] = {key: found.get(key) for key in keys}
    return out


def fmt(value: Any) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if abs(value) >= 100:
            return f"{value:,.0f}"
        return f"{value:.3g}" if abs(value) < 10 else f"{value:.1f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def judge(row: Row, section: Mapping[str, Any]) -> tuple[str, str, str]:
    """(target text, ratio text, met text) of one row."""
    value = section.get(row.key)
    if row.target is None:
        return "", "", ""
    if row.direction == "yes":
        return "yes", "", "n/a" if value is None else ("yes" if value else "**no**")
    op = "≥" if row.direction == ">=" else "≤"
    if row.base is not None:
        base = section.get(row.base)
        target = f"{op} {row.target:g}x"
        measured = value / base if value is not None and base else None
    else:
        target = f"{op} {row.target:,g} {row.unit}"
        measured = value / row.target if value is not None else None
    if measured is None:
        return target, "n/a", "n/a"
    threshold = row.target if row.base is not None else 1.0
    met = measured >= threshold if row.direction == ">=" else measured <= threshold
    return target, f"{measured:.2f}x" if row.base else f"{measured:.2f}", "yes" if met else "**no**"


def table(summary_json: Mapping[str, Any], rows: tuple[Row, ...] = ROWS) -> str:
    lines = [
        "| scenario | figure | measured | target | ratio | met |",
        "| --- | --- | ---: | --- | ---: | --- |",
    ]
    for row in rows:
        section = summary_json.get(row.section, {})
        target, ratio, met = judge(row, section)
        value = fmt(section.get(row.key)) if not row.base else ""
        value = f"{value} {row.unit}".strip() if value and value != "n/a" else value
        lines.append(f"| {row.section} | {row.label} | {value} | {target} | {ratio} | {met} |")
    return "\n".join(lines)


def machine_line(machine: Mapping[str, Any]) -> str:
    return (
        f"{machine.get('cores')} cores ({machine.get('cpu_model')}), "
        f"{machine.get('memory_gib')} GiB; Python {machine.get('python')}, "
        f"{machine.get('java')}, Kafka {machine.get('kafka')}, faust-streaming "
        f"{machine.get('faust_streaming')}, aiokafka {machine.get('aiokafka')}, pyspark "
        f"{machine.get('pyspark')}. Load average (1, 5, 15 min) at the start "
        f"{machine.get('loadavg_start')}, at the end {machine.get('loadavg_end')}: other "
        "work shares this machine, so figures move between runs."
        + _steal_text(machine.get("steal_share"))
    )


def _steal_text(share: float | None) -> str:
    if share is None:
        return ""
    return f" Steal time over the run: {share:.1%} of the machine's CPU time."


def markdown(
    summary_json: Mapping[str, Any], notes: Mapping[str, list[str]], plots: list[str]
) -> str:
    machine = summary_json["machine"]
    parts = [
        "# Benchmark results",
        "",
        f"Run `{machine.get('mode')}` of {machine.get('started_at')} at commit "
        f"`{machine.get('git_commit')}` (uncommitted changes measured too: "
        f"{', '.join(machine.get('uncommitted_changes') or []) or 'none'}), "
        f"{fmt(machine.get('run_s'))} s in all. "
        "Every figure comes from this one run: baselines ran on the same Kafka, the same "
        "data and the same machine, one after another.",
        "",
        machine_line(machine),
        "",
        table(summary_json),
        "",
        "## How each figure was measured",
        "",
    ]
    for section in SCHEMA:
        for note in notes.get(section, []):
            parts.append(f"- **{section}**: {note}")
    if plots:
        parts += ["", "## Plots", ""]
        parts += [f"![{Path(p).stem}]({p if '/' in p else Path(p).name})" for p in plots]
    return "\n".join(parts) + "\n"


def write(
    out: Path,
    summary_json: dict[str, Any],
    notes: Mapping[str, list[str]],
    details: Mapping[str, Any],
    plots: list[str],
) -> None:
    out.mkdir(parents=True, exist_ok=True)
    indent = orjson.OPT_INDENT_2
    (out / "summary.json").write_bytes(orjson.dumps(summary_json, option=indent) + b"\n")
    (out / "details.json").write_bytes(
        orjson.dumps({"notes": notes, "details": details}, option=orjson.OPT_INDENT_2) + b"\n"
    )
    (out / "summary.md").write_text(markdown(summary_json, notes, plots))
    if out.resolve() == RESULTS.resolve():  # the project's own results: the docs follow
        publish(summary_json, notes, plots)


def headline(summary_json: Mapping[str, Any]) -> str:
    """The README's benchmark table: the figures held against a target."""
    machine = summary_json["machine"]
    return (
        f"`make bench` at commit `{machine.get('git_commit')}` ({machine.get('mode')} run, "
        f"{machine.get('started_at')}, {machine.get('cores')} cores; every figure and its "
        "baselines from this one run, [docs/benchmarks.md](docs/benchmarks.md)):\n\n"
        + table(summary_json, tuple(row for row in ROWS if row.target is not None))
        + "\n"
    )


def publish(
    summary_json: Mapping[str, Any], notes: Mapping[str, list[str]], plots: list[str]
) -> None:
    """docs/benchmarks.md and the README's benchmark table, from one run's results (the
    page shows every plot in the results folder, in name order)."""
    shown = sorted({Path(p).name for p in plots} | {p.name for p in RESULTS.glob("*.png")})
    page = markdown(summary_json, notes, [f"../bench/results/{name}" for name in shown])
    (ROOT / "docs" / "benchmarks.md").write_text(page)
    replace_section(README, "benchmarks", headline(summary_json))
