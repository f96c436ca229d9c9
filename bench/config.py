"""The sizes of a run: the full run, the quick smoke run, and a scale factor over both."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
#: The benchmark's own Kafka: its own port and data directory, never the developer's.
KAFKA_PORT = int(os.environ.get("BENCH_KAFKA_PORT", "25092"))
KAFKA_DIR = Path(os.environ.get("BENCH_KAFKA_DIR", ROOT / ".cache" / "bench-kafka"))
WORK_DIR = Path(os.environ.get("BENCH_WORK_DIR", ROOT / ".cache" / "bench-work"))
PARTITIONS = 8


@dataclass(frozen=True)
class Sizes:
    """How much data each scenario preloads and how long it may measure."""

    mode: str
    wordcount_lines: int
    #: The project worker's word-count run stops after this long even if unfinished.
    wordcount_max_s: float
    #: The per-event faust baseline is measured over this window (it is far slower).
    faust_baseline_s: float
    inventory_events: int
    inventory_max_s: float
    #: Rounds of the four inventory runs (the project and Kafka Streams under each
    #: guarantee, in that order); the fastest run of each is compared.
    inventory_rounds: int
    restore_keys: int
    restore_timeout_s: float
    iq_duration_s: float
    iq_connections: int
    iq_sample_keys: int
    failover_keys: int
    batch_events: int
    batch_timeout_s: float
    #: Rounds of (bare count, recompute), run alternately; the fastest of each is compared.
    batch_rounds: int

    def scaled(self, factor: float) -> Sizes:
        """Counts multiplied by ``factor`` (durations unchanged)."""
        if factor == 1.0:
            return self
        return replace(
            self,
            mode=f"{self.mode} x{factor:g}",
            wordcount_lines=max(1000, int(self.wordcount_lines * factor)),
            inventory_events=max(1000, int(self.inventory_events * factor)),
            restore_keys=max(1000, int(self.restore_keys * factor)),
            batch_events=max(1000, int(self.batch_events * factor)),
        )


FULL = Sizes(
    mode="full",
    wordcount_lines=1_000_000,
    wordcount_max_s=240.0,
    faust_baseline_s=60.0,
    inventory_events=300_000,
    inventory_max_s=120.0,
    inventory_rounds=2,
    restore_keys=1_000_000,
    restore_timeout_s=900.0,
    iq_duration_s=30.0,
    iq_connections=16,
    iq_sample_keys=400,
    failover_keys=200,
    batch_events=10_000_000,
    batch_timeout_s=900.0,
    batch_rounds=2,
)

QUICK = Sizes(
    mode="quick",
    wordcount_lines=20_000,
    wordcount_max_s=25.0,
    faust_baseline_s=25.0,
    inventory_events=10_000,
    inventory_max_s=15.0,
    inventory_rounds=1,
    restore_keys=50_000,
    restore_timeout_s=180.0,
    iq_duration_s=6.0,
    iq_connections=8,
    iq_sample_keys=100,
    failover_keys=50,
    batch_events=100_000,
    batch_timeout_s=300.0,
    batch_rounds=1,
)


def sizes(quick: bool, scale: float | None = None) -> Sizes:
    """The sizes of this run; ``BENCH_SCALE`` in the environment when ``scale`` is None."""
    base = QUICK if quick else FULL
    factor = scale if scale is not None else float(os.environ.get("BENCH_SCALE", "1"))
    return base.scaled(factor)
