"""The CI-sized chaos suite: the fault scenarios of ``make chaos`` at a smaller size.

Each test runs one scenario of ``chaos/`` against its own Kafka (chaos/env.py's port)
and real worker processes, with faults under the CI load level (chaos/load.py), and
asserts every one of that scenario's checks (chaos/checks.py). These run with the machine
to themselves (``alone``); the scenarios without load are in test_chaos_inputs.py. The
full run (``make chaos``) adds the three-node broker loss and offers each loaded scenario
half of what its group sustained in a calibration phase.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from chaos import checks
from chaos.load import CI_LEVEL
from chaos.scenarios import broker_outage, disk, kill_worker, scale
from chaos.scenarios.scale import ScalePlan
from chaos.suite import kill_plan
from tests.support.chaos import assert_checks, module_kafka
from tests.support.kafka import LocalKafka

pytestmark = [pytest.mark.integration, pytest.mark.alone, pytest.mark.timeout(900)]


kafka = module_kafka("ci")


def test_kill9_under_load_never_under_counts_and_a_clean_stop_stays_exact(
    kafka: LocalKafka, tmp_path: Path
) -> None:
    """at_least_once: one kill -9 of three workers under load; its over-count is measured
    per table, nothing is under-counted or lost (no traced record either: a key of its
    own, which no duplicate makes up for), and a SIGTERM stop adds no drift."""
    figures = kill_worker.run(kafka, kill_plan("at_least_once", quick=True), CI_LEVEL)
    assert_checks(checks.kill_worker(figures), figures, tmp_path / "kill.json")


def test_kill9_under_load_leaves_every_table_exact_under_exactly_once(
    kafka: LocalKafka, tmp_path: Path
) -> None:
    """exactly_once: after a kill -9 under load and a restart, and after a worker killed
    for good, every table and settled-sales equal the ground truth."""
    figures = kill_worker.run(kafka, kill_plan("exactly_once", quick=True), CI_LEVEL)
    assert_checks(checks.kill_worker(figures), figures, tmp_path / "kill_eos.json")
    assert figures["failover"] is not None


def test_scaling_out_and_in_under_load_fails_no_read_and_leaves_every_table_exact(
    kafka: LocalKafka, tmp_path: Path
) -> None:
    """exactly_once: 2 workers, a third joins under load and leaves with SIGTERM; every
    step moves some partitions and keeps others, no key read fails, every table is exact
    (the stalls are measured: their targets belong to the full run's report)."""
    figures = scale.run(kafka, ScalePlan("exactly_once", rounds=1, hold_s=4.0), CI_LEVEL)
    assert_checks(checks.scale(figures), figures, tmp_path / "scale.json")


def test_workers_survive_the_broker_going_away_and_catch_up(
    kafka: LocalKafka, tmp_path: Path
) -> None:
    figures = broker_outage.run(kafka, CI_LEVEL, down_s=10.0, load_s=4.0)
    assert_checks(checks.broker_outage(figures), figures, tmp_path / "outage.json")


def test_a_full_disk_stops_the_worker_visibly_and_loses_nothing(
    kafka: LocalKafka, tmp_path: Path
) -> None:
    figures = disk.run(kafka, CI_LEVEL, "exactly_once", load_s=4.0)
    if figures.get("skipped"):
        pytest.skip(figures["skipped"])
    assert_checks(checks.disk(figures), figures, tmp_path / "disk.json")
