"""The faust adapter's Membership: what the query layer knows of the group."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from app.main import StreamstateApp


def app_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> StreamstateApp:
    from app.main import create_app
    from core.settings import Settings

    monkeypatch.setenv("APP_DATADIR", str(tmp_path))
    return create_app(Settings())


def test_the_api_sees_the_rebalances_of_the_log_faust_reports_them_to(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = app_in(tmp_path, monkeypatch)
    membership = app.view().membership
    sensors = app.sensors
    state = sensors.on_rebalance_start(app)
    sensors.on_rebalance_return(app, state)
    sensors.on_rebalance_end(app, state)
    [rebalance] = membership.rebalances.last()
    assert rebalance["in_progress"] is False


def test_before_its_first_assignment_a_worker_holds_no_partition_and_knows_no_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    membership = app_in(tmp_path, monkeypatch).view().membership
    assignment = membership.assignment()
    assert assignment is None or not (assignment.actives or assignment.standbys)
    assert membership.hosts() == {}
    assert membership.app_id == "streamstate"
