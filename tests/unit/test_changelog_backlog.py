"""Changelog records wait in the fetch loop's backlog until faust's recovery can take
them, in their order, so that the sources are never held back."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from tables import faust_adapter
from tables.faust_adapter import ChangelogBacklog


class Queue:
    def __init__(self, room: int) -> None:
        self.room = room
        self.items: list[Any] = []

    def full(self) -> bool:
        return len(self.items) >= self.room


class Flow:
    def __init__(self) -> None:
        self.active = True

    def is_active(self) -> bool:
        return self.active


def app_with(queue: Queue, flow: Flow, delay: float = 0.0) -> Any:
    async def callback(message: Any) -> None:
        if delay:
            await asyncio.sleep(delay)
        queue.items.append(message)

    consumer = SimpleNamespace(
        callback=callback, _to_message=lambda tp, record: SimpleNamespace(tp=tp, record=record)
    )
    return SimpleNamespace(
        consumer=consumer, tables=SimpleNamespace(changelog_queue=queue), flow_control=flow
    )


async def test_records_go_on_in_order_while_the_queue_has_room() -> None:
    queue, flow = Queue(room=3), Flow()
    backlog = ChangelogBacklog(app_with(queue, flow))
    backlog.add("c-0", [1, 2], ("gen-a", 1))
    backlog.add("c-1", [3, 4], ("gen-b", 2))
    await backlog.feed()
    assert [(m.tp, m.record, m.fetched_at) for m in queue.items] == [
        ("c-0", 1, ("gen-a", 1)),
        ("c-0", 2, ("gen-a", 1)),
        ("c-1", 3, ("gen-b", 2)),
    ]
    assert backlog  # one record waits for room
    queue.items.clear()
    await backlog.feed()
    assert [m.record for m in queue.items] == [4]
    assert not backlog


async def test_nothing_goes_on_while_faust_holds_its_flow() -> None:
    queue, flow = Queue(room=10), Flow()
    backlog = ChangelogBacklog(app_with(queue, flow))
    backlog.add("c-0", [1, 2], None)
    flow.active = False  # a rebalance: faust's put would wait for the flow
    await backlog.feed()
    assert queue.items == []
    assert backlog
    flow.active = True
    await backlog.feed()
    assert [m.record for m in queue.items] == [1, 2]


async def test_a_round_hands_on_for_one_slice_at_most(monkeypatch: Any) -> None:
    monkeypatch.setattr(faust_adapter, "BACKLOG_SLICE_S", 0.05)
    queue, flow = Queue(room=10_000), Flow()
    backlog = ChangelogBacklog(app_with(queue, flow, delay=0.02))
    backlog.add("c-0", list(range(100)), None)
    await backlog.feed()
    assert 1 <= len(queue.items) < 100  # the rest waits for the next round
    assert [m.record for m in queue.items] == list(range(len(queue.items)))
