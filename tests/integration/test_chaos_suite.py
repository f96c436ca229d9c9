"""The CI-sized chaos suite: the scenarios of ``make chaos`` at a smaller size.

Each test runs one scenario of ``chaos/`` against its own Kafka (port 29192) and real
worker processes, and asserts every one of that scenario's checks (chaos/checks.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from chaos import checks
from chaos.env import cluster
from chaos.scenarios import api_fuzz, bad_input, broker_outage, kill_worker, lost_disk
from chaos.scenarios.kill_worker import KillPlan
from tests.support.kafka import LocalKafka

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def kafka() -> Iterator[LocalKafka]:
    with cluster("ci") as running:
        yield running


def assert_checks(found: list[checks.Check], figures: dict[str, Any], out: Path) -> None:
    """Every check holds; the figures are kept in ``out``."""
    out.write_text(json.dumps(figures, indent=1, default=str))
    failed = [c.what for c in found if not c.ok]
    assert not failed, f"{failed}; figures: {json.dumps(figures, default=str)[:3000]}"


def test_every_malformed_record_is_dead_lettered_once_and_changes_no_table(
    kafka: LocalKafka, tmp_path: Path
) -> None:
    figures = bad_input.run(kafka)
    assert_checks(checks.bad_input(figures), figures, tmp_path / "bad_input.json")


def test_the_api_answers_no_5xx_and_refuses_hostile_requests(
    kafka: LocalKafka, tmp_path: Path
) -> None:
    figures = api_fuzz.run(kafka, cases=150)
    assert_checks(checks.api_fuzz(figures, min_cases=150), figures, tmp_path / "api.json")


def test_a_worker_with_a_lost_disk_restores_every_table_from_the_changelogs(
    kafka: LocalKafka, tmp_path: Path
) -> None:
    figures = lost_disk.run(kafka, lines=600, events=200)
    assert_checks(checks.lost_disk(figures), figures, tmp_path / "lost_disk.json")


def test_kill9_under_load_never_loses_a_count_and_a_clean_stop_stays_exact(
    kafka: LocalKafka, tmp_path: Path
) -> None:
    """at_least_once: the over-count of one kill -9 is measured (kept in the figures), no
    word is under-counted, and a SIGTERM stop under load adds no drift."""
    plan = KillPlan(
        "at_least_once", kills=1, load_before_kill_s=(3.0, 5.0), load_after_restart_s=2.0
    )
    figures = kill_worker.run(kafka, plan)
    assert_checks(checks.kill_worker(figures), figures, tmp_path / "kill.json")
    assert len(figures["over_count_per_kill"]) == 1
    assert figures["over_count_per_kill"][0] >= 0


def test_kill9_under_load_leaves_every_table_exact_under_exactly_once(
    kafka: LocalKafka, tmp_path: Path
) -> None:
    """exactly_once: after a kill -9 under load and a restart, word_counts and inventory
    equal the ground truth, no agent crashed and the restarted worker became ready."""
    plan = KillPlan(
        "exactly_once", kills=1, load_before_kill_s=(3.0, 5.0), load_after_restart_s=2.0
    )
    figures = kill_worker.run(kafka, plan)
    assert_checks(checks.kill_worker(figures), figures, tmp_path / "kill_eos.json")
    assert figures["exact_after_every_kill"] is True
    assert figures["inventory_exact_after_every_kill"] is True


def test_workers_survive_the_broker_going_away_and_catch_up(
    kafka: LocalKafka, tmp_path: Path
) -> None:
    figures = broker_outage.run(kafka, down_s=10.0)
    assert_checks(checks.broker_outage(figures), figures, tmp_path / "outage.json")
