"""Asserting a chaos scenario's checks in a test."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from chaos import checks


def assert_checks(found: list[checks.Check], figures: dict[str, Any], out: Path) -> None:
    """Every check of a guarantee holds (targets, times to be back, are measured: they
    belong to the full run's report); the figures are kept in ``out``."""
    out.write_text(json.dumps(figures, indent=1, default=str))
    failed = [c.what for c in found if not c.ok and not c.target]
    assert found, "the scenario ran no check"
    assert not failed, f"{failed}; figures: {json.dumps(figures, default=str)[:3000]}"
