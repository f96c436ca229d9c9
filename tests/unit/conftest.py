"""Fixtures of the unit tests."""

from __future__ import annotations

import pytest

from tests.support.clock import Clock


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    """The engine's clock, moved by the test."""
    fake = Clock()
    monkeypatch.setattr("tables.engine.time", fake)
    monkeypatch.setattr("tables.task.time", fake)
    monkeypatch.setattr("tables.stalls.time", fake)
    return fake
