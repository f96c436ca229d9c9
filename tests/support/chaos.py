"""The chaos scenarios in tests: a module's Kafka, and a scenario's checks asserted."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from chaos import checks
from chaos.env import cluster
from tests.support.kafka import LocalKafka


def module_kafka(name: str) -> Callable[[], Iterator[LocalKafka]]:
    """A module-scoped fixture: a fresh local Kafka for the module's scenarios
    (chaos.env.cluster ``name``), stopped after its last test."""

    @pytest.fixture(scope="module")
    def kafka() -> Iterator[LocalKafka]:
        with cluster(name) as running:
            yield running

    return kafka


def assert_checks(found: list[checks.Check], figures: dict[str, Any], out: Path) -> None:
    """Every check of a guarantee holds (targets, times to be back, are measured: they
    belong to the full run's report); the figures are kept in ``out``."""
    out.write_text(json.dumps(figures, indent=1, default=str))
    failed = [c.what for c in found if not c.ok and not c.target]
    assert found, "the scenario ran no check"
    assert not failed, f"{failed}; figures: {json.dumps(figures, default=str)[:3000]}"
