"""Readiness asks the worker's consumer whether it holds a live broker connection."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from api.broker import consumer_connected


class Connection:
    def __init__(self, up: bool) -> None:
        self.up = up

    def connected(self) -> bool:
        return self.up


def worker_with(*states: bool) -> Any:
    client = SimpleNamespace(_conns={n: Connection(up) for n, up in enumerate(states)})
    thread = SimpleNamespace(_consumer=SimpleNamespace(_client=client))
    return SimpleNamespace(consumer=SimpleNamespace(_thread=thread))


def test_one_live_connection_is_enough() -> None:
    assert consumer_connected(worker_with(False, True)) is True


def test_no_live_connection_means_unreachable() -> None:
    assert consumer_connected(worker_with(False, False)) is False
    assert consumer_connected(worker_with()) is False


def test_before_the_consumer_starts_nothing_is_known() -> None:
    assert consumer_connected(SimpleNamespace(consumer=SimpleNamespace())) is None
