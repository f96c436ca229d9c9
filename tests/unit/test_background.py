"""Background loops that talk to Kafka stop between two requests, within a bound."""

from __future__ import annotations

import asyncio

from api.background import pause, stopped


async def test_a_loop_asked_to_stop_ends_by_itself_and_is_not_cancelled() -> None:
    stopping = asyncio.Event()
    closed: list[str] = []

    async def loop() -> None:
        try:
            while not stopping.is_set():
                await pause(stopping, 60.0)  # a long pause cut short by the stop
        finally:
            await asyncio.sleep(0.05)  # closing its client takes a moment: not cut short
            closed.append("client")

    task = asyncio.ensure_future(loop())
    await asyncio.sleep(0.01)
    await asyncio.wait_for(stopped(task, stopping, grace_s=5.0), 2.0)
    assert closed == ["client"]
    assert task.done()
    assert not task.cancelled()


async def test_a_loop_that_does_not_stop_is_cancelled_after_the_grace() -> None:
    stopping = asyncio.Event()

    async def stuck() -> None:
        await asyncio.sleep(60.0)  # a request to a broker that does not answer

    task = asyncio.ensure_future(stuck())
    started = asyncio.get_running_loop().time()
    await stopped(task, stopping, grace_s=0.2)
    assert task.cancelled()
    assert 0.2 <= asyncio.get_running_loop().time() - started < 2.0


async def test_pause_sleeps_its_time_when_nothing_stops_it() -> None:
    stopping = asyncio.Event()
    started = asyncio.get_running_loop().time()
    await pause(stopping, 0.1)
    assert asyncio.get_running_loop().time() - started >= 0.1


async def test_stopping_nothing_is_nothing() -> None:
    stopping = asyncio.Event()
    await stopped(None, stopping)
    assert stopping.is_set()
