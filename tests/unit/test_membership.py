"""The faust adapter's Membership: what the query layer knows of the group."""

from __future__ import annotations

from pathlib import Path

import pytest

from tables.faust_adapter import FaustMembership


def test_the_rebalance_log_sees_a_rebalance_that_starts_after_the_membership_is_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """faust hands a sensor's rebalance end the state its start returned: a sensor added
    while a rebalance runs crashed the recovery with a KeyError. The log is registered
    when the membership is made, before the worker joins its group."""
    from app.main import create_app
    from core.settings import Settings

    monkeypatch.setenv("APP_DATADIR", str(tmp_path))
    app = create_app(Settings())
    membership = FaustMembership(app, bootstrap="127.0.0.1:9")
    sensors = app.sensors
    state = sensors.on_rebalance_start(app)
    sensors.on_rebalance_return(app, state)
    sensors.on_rebalance_end(app, state)
    [rebalance] = membership.rebalances.last()
    assert rebalance["in_progress"] is False


def test_before_its_first_assignment_a_worker_holds_no_partition_and_knows_no_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.main import create_app
    from core.settings import Settings

    monkeypatch.setenv("APP_DATADIR", str(tmp_path))
    membership = FaustMembership(create_app(Settings()), bootstrap="127.0.0.1:9")
    assignment = membership.assignment()
    assert assignment is None or not (assignment.actives or assignment.standbys)
    assert membership.hosts() == {}
    assert membership.app_id == "streamstate"
