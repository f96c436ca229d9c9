"""A rebalance log attached while faust's first rebalance is under way."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from faust.sensors.base import SensorDelegate
from mode.utils.trees import Node

from tables.rebalances import RebalanceLog, attach


def rebalancing_app() -> Any:
    """An app as faust leaves it between the start and the end of a rebalance."""
    app = SimpleNamespace(consumer_generation_id=3)
    app.beacon = Node(app)
    app.sensors = SensorDelegate(app)
    app._rebalancing_sensor_state = app.sensors.on_rebalance_start(app)
    return app


def test_a_log_attached_mid_rebalance_sees_its_end() -> None:
    app, log = rebalancing_app(), RebalanceLog()
    attach(app, log)
    app.sensors.on_rebalance_return(app, app._rebalancing_sensor_state)
    app.sensors.on_rebalance_end(app, app._rebalancing_sensor_state)
    [seen] = log.last()
    assert seen["in_progress"] is False
    assert seen["generation"] == 3


def test_a_sensor_merely_added_mid_rebalance_breaks_faust_at_its_end() -> None:
    app, log = rebalancing_app(), RebalanceLog()
    app.sensors.add(log)
    with pytest.raises(KeyError):
        app.sensors.on_rebalance_end(app, app._rebalancing_sensor_state)


def test_a_log_attached_between_rebalances_sees_the_next_one() -> None:
    app, log = rebalancing_app(), RebalanceLog()
    app._rebalancing_sensor_state = None
    attach(app, log)
    state = app.sensors.on_rebalance_start(app)
    app.sensors.on_rebalance_end(app, state)
    assert [r["in_progress"] for r in log.last()] == [False]
