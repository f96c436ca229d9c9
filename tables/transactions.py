"""A source partition's transactional producer, taken the way faust's own commit takes it.

faust (``exactly_once``) keeps one transactional producer per ``{app}-{group}-{partition}``
and a lock per producer that its commit holds. At a rebalance it replaces the producers
of the partitions that move: the new one is registered, with a new lock, before faust
begins its first transaction, so for a moment the registered producer is in no
transaction and a send fails with "Can't send messages while not in transaction"; and
a lock taken before the replacement no longer keeps faust's commit out, which then ends
the transaction under a send. :func:`in_transaction` waits until the registered
producer is in a transaction and holds the lock that is registered with it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

#: How long a producer may stay out of a transaction before the caller gives up.
BEGIN_WAIT_S = 30.0


class TransactionUnavailable(RuntimeError):
    """The partition has no transactional producer in a transaction."""


def transactional_id(app: Any, topic: str, partition: int) -> str:
    """faust's transactional id of a source partition."""
    return f"{app.conf.id}-{app.assignor.group_for_topic(topic)}-{partition}"


@contextlib.asynccontextmanager
async def in_transaction(
    producer: Any, tid: str, wait_s: float = BEGIN_WAIT_S
) -> AsyncIterator[Any]:
    """Hold faust's lock of producer ``tid`` and yield the producer, in a transaction."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    while True:
        lock = producer._trn_locks.get(tid)
        if lock is None:
            raise TransactionUnavailable(f"no transactional producer {tid}")
        async with lock:
            transaction = producer._transaction_producers.get(tid)
            manager = getattr(transaction, "_txn_manager", None)
            # A lock taken just before faust replaced it excludes nothing any more.
            current = producer._trn_locks.get(tid) is lock
            if current and manager is not None and manager.is_in_transaction():
                yield transaction
                return
        if loop.time() >= deadline:
            state = "stopped" if transaction is None else "in no transaction"
            raise TransactionUnavailable(f"transactional producer {tid} {state} for {wait_s} s")
        await asyncio.sleep(0.05)
