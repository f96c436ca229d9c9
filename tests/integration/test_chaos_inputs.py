"""The chaos scenarios without load, at CI size: bad input, a hostile API client and a
lost disk.

Each test runs one scenario of ``chaos/`` against the module's own Kafka and real worker
processes and asserts every one of that scenario's checks (chaos/checks.py). Nothing here
is timed under load, so these run beside the other modules; the faults under load are in
test_chaos_suite.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from chaos import checks
from chaos.scenarios import api_fuzz, bad_input, lost_disk
from tests.support.chaos import assert_checks, module_kafka
from tests.support.kafka import LocalKafka

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


kafka = module_kafka("ci-inputs")


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
