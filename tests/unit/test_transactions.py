"""Taking a partition's transactional producer while faust replaces it at a rebalance."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest

from tables.transactions import TransactionUnavailable, in_transaction


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
