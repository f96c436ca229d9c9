"""A source partition's transactional producer, taken the way faust's own commit takes it.

faust (``exactly_once``) keeps one transactional producer per ``{app}-{group}-{partition}``
and a lock per producer that its commit holds. At a rebalance it replaces the producers
of the partitions that move: the new one is registered, with a new lock, before faust
begins its first transaction, so for a moment the registered producer is in no
transaction and a send fails with "Can't send messages while not in transaction"; and
a lock taken before the replacement no longer keeps faust's commit out, which then ends
the transaction under a send. :func:`in_transaction` waits until the registered
producer is in a transaction and holds the lock that is registered with it.

faust also keeps the producers of partitions a rebalance moves to another worker when
this worker becomes their standby: its transaction manager leaves standby partitions out
of the revoked ones whose producers it stops. The other worker's producer for the same
id then fences the one kept here, and when the partition comes back (at a failover) faust
reuses the fenced producer: the first send fails and the next commit crashes the worker.
:func:`stop_revoked_producers` stops them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterable
from typing import Any

logger = logging.getLogger(__name__)

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


def _transactional_ids(manager: Any, tps: Iterable[Any]) -> set[str]:
    """The transactional ids of source partitions, active or standby."""
    app = manager.app
    ids = set()
    for tp in tps:
        try:
            group = app.assignor.group_for_topic(tp.topic)
        except KeyError:  # a topic of no group (no transactional producer)
            continue
        ids.add(f"{app.conf.id}-{group}-{tp.partition}")
    return ids


def stop_revoked_producers(consumer: Any) -> None:
    """Patch one faust consumer's transaction manager (idempotent; exactly-once only):
    at a rebalance, stop the producer of every revoked partition that is no longer active
    here, those now standby here included (faust's own handler, which runs next, leaves
    those out)."""
    manager = getattr(consumer, "transactions", None)
    if manager is None or getattr(manager, "_streamstate_stop_revoked", False):
        return
    faust_on_rebalance = manager.on_rebalance

    async def on_rebalance(assigned: set[Any], revoked: set[Any], newly_assigned: set[Any]) -> None:
        producer = manager.producer
        active = manager._tps_to_transactional_ids(assigned)
        for tid in sorted(_transactional_ids(manager, revoked) - active):
            if tid not in producer._transaction_producers:
                continue
            logger.info("stopping transactional producer %s: its partition moved", tid)
            lock = producer._trn_locks.get(tid)
            if lock is None:
                await producer.stop_transaction(tid)
                continue
            async with lock:  # not while a send of this transaction is under way
                await producer.stop_transaction(tid)
        await faust_on_rebalance(assigned, revoked, newly_assigned)

    manager.on_rebalance = on_rebalance
    manager._streamstate_stop_revoked = True
