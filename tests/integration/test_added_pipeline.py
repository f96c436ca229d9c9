"""A pipeline added without touching the project: one module with a batch function and a
declaration, named in ``STREAMSTATE_EXTRA_PIPELINES``, run exactly once on a real broker
through a kill -9, its table served over HTTP and its poison records dead-lettered."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.support.kafka import LocalKafka, local_kafka
from tests.support.kafka_io import committed_records, produce, read_topic, wait_equal, wait_for
from tests.support.workers import Worker

pytestmark = pytest.mark.integration

#: The whole pipeline, as a user writes it.
BALANCES = '''
"""Account balances: the sum of each account's deposits."""

import orjson

from tables.pipeline import Batch, Context, Pipeline, TableSpec


def apply_deposits(batch: Batch) -> None:
    balances = batch.table("balances")
    added: dict[bytes, int] = {}
    for record in batch.of("deposits"):
        amount = orjson.loads(record.value)["amount"]
        if not isinstance(amount, int):
            raise TypeError(f"amount {amount!r} is not a whole number")
        added[record.key] = added.get(record.key, 0) + amount
    for account, amount in added.items():
        balances.put(account, (balances.get(account) or 0) + amount)


def pipelines(context: Context) -> list[Pipeline]:
    return [
        Pipeline(
            name="balances",
            reads=("deposits",),
            writes=(TableSpec("balances", queryable=True),),
            process=apply_deposits,
        )
    ]
'''

POISON = [(b"acct-1", b"not json"), (b"acct-2", b'{"amount": "ten"}'), (b"acct-3", b"{}")]


@pytest.fixture(scope="module")
def kafka() -> Any:
    with local_kafka("added-pipeline") as cluster:
        yield cluster


def balances_over_http(worker: Worker, accounts: list[str]) -> dict[str, Any]:
    found = {}
    for account in accounts:
        status, body = worker.get(f"/tables/balances/keys/{account}")
        found[account] = body["value"] if status == 200 else status
    return found


def test_an_added_pipeline_runs_exactly_once_through_a_kill9(
    kafka: LocalKafka, tmp_path: Path
) -> None:
    assert len(BALANCES.strip().splitlines()) < 50
    (tmp_path / "balances.py").write_text(BALANCES)
    rng = random.Random(5)
    deposits = [(f"acct-{rng.randrange(40)}", rng.randrange(1, 100)) for _ in range(20_000)]
    want = Counter[str]()
    for account, amount in deposits:
        want[account] += amount
    env = {
        "PROCESSING_GUARANTEE": "exactly_once",
        "STREAMSTATE_EXTRA_PIPELINES": "balances",
        "PYTHONPATH": str(tmp_path),
        "STREAMSTATE_SOURCE_FETCH_MAX_RECORDS": "200",
    }
    worker = Worker(kafka, tmp_path / "w", extra_env=env).start()
    applied = lambda: committed_records(kafka.bootstrap, "streamstate", "deposits")  # noqa: E731
    try:
        worker.wait_ready()
        produce(kafka.bootstrap, "deposits", POISON)
        produce(kafka.bootstrap, "deposits", [(a, {"amount": n}) for a, n in deposits])
        at_kill = wait_for(lambda: applied() or None, 60, interval=0.05)
        worker.kill9()
    finally:
        worker.stop()
    assert 0 < at_kill < len(deposits) + len(POISON)
    worker.start()
    try:
        worker.wait_ready()
        accounts = sorted(want)
        wait_equal(lambda: balances_over_http(worker, accounts), dict(want), 120, "balances")
        wait_equal(applied, len(deposits) + len(POISON), 30, "committed deposits")
        dead = read_topic(kafka.bootstrap, "deposits-dlq")
        assert sorted((r.key, r.value) for r in dead) == sorted(POISON)
        reasons = sorted(r.headers["error"].decode() for r in dead)
        assert reasons[0].startswith("processing failed: JSONDecodeError")
        assert reasons[1].startswith("processing failed: KeyError")
        assert reasons[2] == "processing failed: TypeError: amount 'ten' is not a whole number"
        status, listed = worker.get("/tables")
        assert status == 200
        assert "balances" in [t["name"] for t in listed["tables"]]
    finally:
        worker.stop()
