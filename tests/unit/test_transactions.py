"""Taking a partition's transactional producer while faust replaces it at a rebalance."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from tables.transactions import TransactionUnavailable, in_transaction, stop_revoked_producers


@dataclass
class Manager:
    in_txn: bool = False

    def is_in_transaction(self) -> bool:
        return self.in_txn


@dataclass
class Transaction:
    _txn_manager: Manager = field(default_factory=Manager)


@dataclass
class Producer:
    _transaction_producers: dict[str, Any] = field(default_factory=dict)
    _trn_locks: dict[str, asyncio.Lock] = field(default_factory=dict)

    async def stop_transaction(self, tid: str) -> None:
        stale = self._transaction_producers.pop(tid)
        stale.stopped_under_lock = self._trn_locks[tid].locked()


def test_a_producer_not_yet_in_its_first_transaction_is_waited_for() -> None:
    async def scenario() -> bool:
        producer = Producer()
        fresh = Transaction()
        producer._transaction_producers["app-1-3"] = fresh
        producer._trn_locks["app-1-3"] = asyncio.Lock()

        async def faust_begins() -> None:
            await asyncio.sleep(0.2)
            fresh._txn_manager.in_txn = True

        begin = asyncio.create_task(faust_begins())
        async with in_transaction(producer, "app-1-3", wait_s=5) as transaction:
            assert transaction is fresh
            in_txn = transaction._txn_manager.is_in_transaction()
            locked = producer._trn_locks["app-1-3"].locked()
        await begin
        return in_txn and locked

    assert asyncio.run(scenario())


def test_a_producer_that_never_comes_back_is_an_error_that_names_it() -> None:
    async def scenario() -> None:
        producer = Producer(_trn_locks={"app-1-3": asyncio.Lock()})  # stopped, not replaced
        async with in_transaction(producer, "app-1-3", wait_s=0.2):
            pass

    with pytest.raises(TransactionUnavailable, match="app-1-3 stopped"):
        asyncio.run(scenario())
    with pytest.raises(TransactionUnavailable, match="no transactional producer app-9-9"):
        asyncio.run(_enter(Producer(), "app-9-9"))


async def _enter(producer: Producer, tid: str) -> None:
    async with in_transaction(producer, tid, wait_s=0.1):
        pass


def test_a_lock_replaced_while_it_was_awaited_is_not_taken_for_the_current_one() -> None:
    async def scenario() -> bool:
        producer = Producer()
        old_lock, new_lock = asyncio.Lock(), asyncio.Lock()
        producer._trn_locks["app-1-3"] = old_lock
        replacement = Transaction(Manager(in_txn=True))

        async def faust_replaces() -> None:
            async with old_lock:  # held while faust swaps producer and lock
                await asyncio.sleep(0.1)
                producer._transaction_producers["app-1-3"] = replacement
                producer._trn_locks["app-1-3"] = new_lock

        swap = asyncio.create_task(faust_replaces())
        await asyncio.sleep(0)
        async with in_transaction(producer, "app-1-3", wait_s=5) as transaction:
            held = new_lock.locked() and not old_lock.locked()
            same = transaction is replacement
        await swap
        return held and same

    assert asyncio.run(scenario())


@dataclass
class Stoppable:
    stopped_under_lock: bool | None = None


@dataclass(frozen=True)
class TP:
    topic: str
    partition: int


class Assignor:
    def __init__(self, standby: set[TP]) -> None:
        self.standby = standby
        self.groups = {"item-events": 1, "payments": 1, "text-lines": 0}

    def group_for_topic(self, topic: str) -> int:
        return self.groups[topic]

    def is_standby(self, tp: TP) -> bool:
        return tp in self.standby


class TransactionManager:
    """faust's manager: on_rebalance starts and stops producers, standbys left out."""

    def __init__(self, producer: Producer, assignor: Assignor) -> None:
        self.producer = producer
        self.app = SimpleNamespace(assignor=assignor, conf=SimpleNamespace(id="app"))
        self.calls: list[tuple[set[TP], set[TP]]] = []

    def _tps_to_transactional_ids(self, tps: set[TP]) -> set[str]:
        assignor = self.app.assignor
        return {
            f"app-{assignor.group_for_topic(tp.topic)}-{tp.partition}"
            for tp in tps
            if not assignor.is_standby(tp)
        }

    async def on_rebalance(self, assigned: set[TP], revoked: set[TP], newly: set[TP]) -> None:
        self.calls.append((assigned, revoked))


def test_producers_of_partitions_now_standby_here_are_stopped_at_a_rebalance() -> None:
    async def scenario() -> tuple[Producer, TransactionManager]:
        moved = {TP("item-events", p) for p in (0, 1)} | {TP("payments", p) for p in (0, 1)}
        kept = {TP("item-events", p) for p in (2, 3)} | {TP("text-lines", 0)}
        producer = Producer()
        for tid in ("app-1-0", "app-1-1", "app-1-2", "app-1-3", "app-0-0"):
            producer._transaction_producers[tid] = Stoppable()
            producer._trn_locks[tid] = asyncio.Lock()
        # faust's assignor counts the moved source partitions as standby here now
        manager = TransactionManager(producer, Assignor(standby=moved))
        consumer = SimpleNamespace(transactions=manager)
        stop_revoked_producers(consumer)
        stop_revoked_producers(consumer)  # idempotent
        await manager.on_rebalance(kept, moved, set())
        return producer, manager

    producer, manager = asyncio.run(scenario())
    assert sorted(producer._transaction_producers) == ["app-0-0", "app-1-2", "app-1-3"]
    assert len(manager.calls) == 1  # faust's own handler still runs, once


def test_a_producer_is_stopped_under_its_lock_and_a_partition_kept_by_another_topic_stays() -> None:
    async def scenario() -> dict[str, Any]:
        producer = Producer()
        stale = {tid: Stoppable() for tid in ("app-1-0", "app-1-1")}
        producer._transaction_producers.update(stale)
        producer._trn_locks.update({tid: asyncio.Lock() for tid in stale})
        manager = TransactionManager(producer, Assignor(standby=set()))
        consumer = SimpleNamespace(transactions=manager)
        stop_revoked_producers(consumer)
        # item-events 1 moved; payments 1 (same group and partition) stays active here
        revoked = {TP("item-events", 0), TP("item-events", 1), TP("unknown-topic", 0)}
        await manager.on_rebalance({TP("payments", 1)}, revoked, set())
        return {"left": sorted(producer._transaction_producers), "stale": stale}

    result = asyncio.run(scenario())
    assert result["left"] == ["app-1-1"]
    assert result["stale"]["app-1-0"].stopped_under_lock is True
    assert result["stale"]["app-1-1"].stopped_under_lock is None
