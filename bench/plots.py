"""PNG plots of a run (matplotlib, headless)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def _xy(points: Sequence[Sequence[float]]) -> tuple[list[float], list[float]]:
    return [float(p[0]) for p in points], [float(p[1]) for p in points]


def throughput(details: Mapping[str, Any], path: Path) -> bool:
    wordcount, inventory = details.get("wordcount", {}), details.get("inventory", {})
    curves = [
        ("project worker", wordcount.get("project_rates")),
        ("faust baseline", wordcount.get("baseline_rates")),
        ("aiokafka ceiling", wordcount.get("ceiling_rates")),
        ("inventory (events/s)", inventory.get("rates")),
    ]
    for name, section in (("word count", wordcount), ("inventory", inventory)):
        for label, run in (section.get("runs") or {}).items():
            if label.startswith("Kafka Streams"):
                curves.append((f"{name}, {label}", run.get("rates")))
    curves = [(label, points) for label, points in curves if points]
    if not curves:
        return False
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for label, points in curves:
        x, y = _xy(points)
        ax.plot(x, y, marker=".", label=label)
    ax.set_yscale("log")
    ax.set_xlabel("seconds since the watch began (ceiling: since its first fetch)")
    ax.set_ylabel("lines/s (log)")
    ax.set_title("Throughput over time")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


#: (label, summary key) of each bar of a scenario's comparison, in order.
BARS = (
    ("project\nALOS", "events_per_s"),
    ("project\nEOS", "eos_events_per_s"),
    ("Kafka\nStreams\nALOS", "baseline_kstreams_events_per_s"),
    ("Kafka\nStreams\nEOS v2", "baseline_kstreams_eos_events_per_s"),
)
CEILINGS = {
    "wordcount": "ceiling_aiokafka_events_per_s",
    "inventory": "ceiling_consume_parse_events_per_s",
}


def kstreams(figures: Mapping[str, Any], path: Path) -> bool:
    """Per scenario, the project and Kafka Streams under both guarantees and the ceiling,
    with the project's ratio to Kafka Streams under the same guarantee over its bars; and
    the peak RSS of each."""
    sections = [s for s in CEILINGS if figures.get(s, {}).get("baseline_kstreams_events_per_s")]
    if not sections:
        return False
    fig, axes = plt.subplots(1, len(sections) + 1, figsize=(5.5 * len(sections) + 4, 4.8))
    for ax, section in zip(axes, sections, strict=False):
        found = figures[section]
        bars = [(label, found.get(key)) for label, key in BARS]
        bars.append(("ceiling", found.get(CEILINGS[section])))
        values = [v or 0.0 for _, v in bars]
        colors = ["tab:blue", "tab:blue", "tab:orange", "tab:orange", "tab:gray"]
        ax.bar(range(len(bars)), values, color=colors)
        ax.set_xticks(range(len(bars)), [label for label, _ in bars], fontsize=8)
        for index, (ours, theirs) in enumerate(((0, 2), (1, 3))):
            if values[ours] and values[theirs]:
                ratio = values[ours] / values[theirs]
                ax.annotate(f"{ratio:.2f}x", (index, values[ours]), ha="center", va="bottom")
        ax.set_ylabel("events/s" if section == "inventory" else "lines/s")
        ax.set_title(f"{section}: project vs Kafka Streams (ratio)")
        ax.grid(True, axis="y", alpha=0.3)
    memory = axes[-1]
    labels, values, colors = [], [], []
    for section in sections:
        for who, key, color in (
            ("project", "peak_rss_mib", "tab:blue"),
            ("Kafka Streams", "baseline_kstreams_peak_rss_mib", "tab:orange"),
        ):
            labels.append(f"{section}\n{who.replace(' ', chr(10))}")
            values.append(figures[section].get(key) or 0.0)
            colors.append(color)
    memory.bar(range(len(values)), values, color=colors)
    memory.set_xticks(range(len(values)), labels, fontsize=7)
    memory.set_ylabel("MiB")
    memory.set_title("peak RSS (VmHWM)")
    memory.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def latency(details: Mapping[str, Any], path: Path) -> bool:
    iq = details.get("iq", {})
    runs = [(name, iq.get(name)) for name in ("local", "routed") if iq.get(name)]
    if not runs:
        return False
    quantiles = list(runs[0][1]["latency_ms"])
    fig, ax = plt.subplots(figsize=(8, 4.5))
    width = 0.8 / len(runs)
    for index, (name, run) in enumerate(runs):
        values = [run["latency_ms"][q] or 0.0 for q in quantiles]
        xs = [i + index * width for i in range(len(quantiles))]
        ax.bar(xs, values, width, label=f"{name} ({run['rps']:,.0f} req/s)")
    ax.set_xticks([i + width * (len(runs) - 1) / 2 for i in range(len(quantiles))], quantiles)
    ax.set_ylabel("ms")
    ax.set_title("Key read latency percentiles")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def restore(details: Mapping[str, Any], path: Path) -> bool:
    series = details.get("restore", {}).get("series")
    failover = details.get("failover", {}).get("series")
    if not series and not failover:
        return False
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    if series:
        x, y = _xy(series)
        axes[0].plot(x, y, marker=".")
        axes[0].set_xlabel("seconds since the worker started")
        axes[0].set_ylabel("changelog records restored")
        axes[0].set_title("Full restore (from /ready progress)")
        axes[0].grid(True, alpha=0.3)
    if failover:
        x = [float(p[0]) for p in failover]
        axes[1].plot(x, [p[1] for p in failover], marker=".", label="answered by an active")
        axes[1].plot(x, [p[2] for p in failover], marker=".", label="failed reads")
        axes[1].set_xlabel("seconds since kill -9")
        axes[1].set_ylabel("keys per pass")
        axes[1].set_title("Failover")
        axes[1].grid(True, alpha=0.3)
        axes[1].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def draw(
    details: Mapping[str, Any], out: Path, figures: Mapping[str, Any] | None = None
) -> list[str]:
    """Every plot the details (and figures) allow; returns the file names written."""
    made = []
    if figures is not None and kstreams(figures, out / "kstreams.png"):
        made.append("kstreams.png")
    for name, function in (("throughput", throughput), ("latency", latency), ("restore", restore)):
        path = out / f"{name}.png"
        if function(details, path):
            made.append(path.name)
    return made
