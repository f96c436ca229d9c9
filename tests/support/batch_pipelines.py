"""Pipelines written as batch functions (docs/architecture.md, "Adding a pipeline"): one
that declares nothing about its recompute, and one that declares its function may be
replayed over its topic (``recompute="replay"``)."""

from __future__ import annotations

import orjson

from tables.pipeline import Batch, Context, Pipeline, SourceSpec, TableSpec

DEPOSITS = "deposits"


def apply_deposits(batch: Batch) -> None:
    balances = batch.table("balances")
    added: dict[bytes, int] = {}
    for record in batch.of(DEPOSITS):
        amount = orjson.loads(record.value or b"null")["amount"]
        if not isinstance(amount, int):
            raise TypeError(f"amount {amount!r} is not a whole number")
        assert record.key is not None
        added[record.key] = added.get(record.key, 0) + amount
    for account, amount in added.items():
        balances.put(account, (balances.get(account) or 0) + amount)


def count_deposits(batch: Batch) -> None:
    counts = batch.table("deposit_counts")
    for record in batch.of(DEPOSITS):
        if record.key is not None:
            counts.put(record.key, (counts.get(record.key) or 0) + 1)


def pipelines(context: Context) -> list[Pipeline]:
    return [
        Pipeline(
            name="balances",
            reads=(DEPOSITS,),
            writes=(TableSpec("balances", queryable=True),),
            process=apply_deposits,
            sources=(SourceSpec(DEPOSITS),),
        ),
        Pipeline(
            name="deposit_counts",
            reads=(DEPOSITS,),
            writes=(TableSpec("deposit_counts", queryable=True),),
            process=count_deposits,
            recompute="replay",
        ),
    ]
