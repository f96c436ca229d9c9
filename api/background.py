"""Stopping the API's background loops that talk to Kafka.

Cancelling an aiokafka client while it opens a connection loses that connection, which
is logged at ERROR when it is collected ("Unclosed AIOKafkaConnection"). So a loop that
talks to Kafka is stopped between two requests: it is asked to stop, given
:data:`GRACE_S` to finish the request under way and close its client, and only then
cancelled (a broker that does not answer must not hold up the worker's stop)."""

from __future__ import annotations

import asyncio
import contextlib

#: how long a loop asked to stop may take to finish its request and close its client
GRACE_S = 5.0


async def cancelled(task: asyncio.Task[None] | None) -> None:
    """Cancel ``task`` (if any) and wait until it has stopped."""
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def pause(stopping: asyncio.Event, seconds: float) -> None:
    """Sleep ``seconds``, or less if ``stopping`` is set meanwhile."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stopping.wait(), seconds)


async def stopped(
    task: asyncio.Task[None] | None, stopping: asyncio.Event, grace_s: float = GRACE_S
) -> None:
    """Set ``stopping``, give ``task`` ``grace_s`` to end by itself, then cancel it."""
    stopping.set()
    if task is None:
        return
    await asyncio.wait({task}, timeout=grace_s)
    await cancelled(task)
