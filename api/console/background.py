"""Stopping the console's background tasks."""

from __future__ import annotations

import asyncio
import contextlib


async def cancelled(task: asyncio.Task[None] | None) -> None:
    """Cancel ``task`` (if any) and wait until it has stopped."""
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
