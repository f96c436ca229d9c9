"""The demo pipelines (agents/) in the test driver, against the ground truth that the
chaos suite computes from the source topics on its own (chaos/truth.py): every table
exact under exactly_once, through crashes at every point of a cycle; no under-count and
no lost pair under at_least_once."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import orjson
import pytest

from chaos.corpus import build as build_corpus
from chaos.truth import Truth
from chaos.workload import PARTITIONS, Workload, product_records
from streams.testing import CRASH_POINTS, Crash, TestDriver
from tables.engine import TP

DEMO = ("agents.words", "agents.inventory", "agents.sales", "agents.settling")
START = 1_700_000_000_000
STEP_MS = 15_000


def demo_run(
    *, exactly_once: bool, seed: int, steps: int, crash: str | None = None
) -> tuple[TestDriver, int]:
    """The chaos workload through the demo pipelines, with a crash armed now and then;
    returns the driver and how many crashes happened."""
    driver = TestDriver(
        *DEMO,
        partitions=PARTITIONS,
        now_ms=START + 5 * 3_600_000,
        exactly_once=exactly_once,
        fetch_records=97,
    )
    workload = Workload(seed, "r1")
    for key, value, ts in product_records(START):
        driver.produce("products", value, key=key, timestamp=ts)
    rng, clock, crashes = random.Random(seed), START, 0
    for step in range(steps):
        clock += STEP_MS
        for r in workload.next_lines(20):
            driver.produce("text-lines", r.value, partition=r.partition)
        for r in workload.next_events(30, clock):
            driver.produce("item-events", r.value, key=r.key, partition=r.partition)
        for r in workload.due_payments(clock):
            driver.produce("payments", r.value, key=r.key, partition=r.partition)
        if step % 5 == 0:
            driver.produce("item-events", b"not json", key="store-01")
            if crash is not None:
                driver.crash(crash, cycle=rng.randint(1, 4))  # type: ignore[arg-type]
            crashes += run_through_crashes(driver)
    return driver, crashes + run_through_crashes(driver)


def run_through_crashes(driver: TestDriver) -> int:
    """Run until idle, restarting after each crash; how many crashes there were."""
    crashes = 0
    while True:
        try:
            driver.run()
            return crashes
        except Crash:
            crashes += 1
            driver.restart()


def truth_of(driver: TestDriver) -> Truth:
    truth = Truth()
    records = driver.log.records
    for p in range(PARTITIONS):
        truth.add_products(p, records.get(TP("products", p), []))
    for p in range(PARTITIONS):
        truth.add_lines(p, records.get(TP("text-lines", p), []))
        truth.add_events(p, records.get(TP("item-events", p), []))
        truth.add_payments(p, records.get(TP("payments", p), []))
    return truth


def settled(driver: TestDriver) -> Counter[tuple[str, str]]:
    pairs = (orjson.loads(r.value or b"{}") for r in driver.outputs("settled-sales"))
    return Counter((p["sale"]["event_id"], p["payment"]["payment_id"]) for p in pairs)


def expected_tables(truth: Truth) -> dict[str, Any]:
    return {
        "word_counts": {k.decode(): v for k, v in truth.words().items()},
        "inventory": truth.inventory,
        "sales_by_category": {
            window: {"units": units, "revenue": revenue}
            for window, (units, revenue) in truth.sales.items()
        },
        "unsettled_sales": dict(truth.unsettled),
    }


@pytest.mark.parametrize("crash", [None, "before_kafka", "halfway_into_kafka", "before_the_store"])
def test_exactly_once_every_table_and_pair_equals_the_truth(crash: str | None) -> None:
    driver, crashes = demo_run(exactly_once=True, seed=3, steps=60, crash=crash)
    assert (crashes > 0) is (crash is not None)
    truth = truth_of(driver)
    for table, want in expected_tables(truth).items():
        assert driver.table(table) == want, table
    pairs = settled(driver)
    assert set(pairs) == set(truth.pairs)
    assert max(pairs.values()) == 1  # none twice
    assert len(driver.dead_letters("item-events")) == 12


@pytest.mark.parametrize("crash", CRASH_POINTS)
def test_at_least_once_counts_nothing_short_and_loses_no_pair(crash: str) -> None:
    driver, crashes = demo_run(exactly_once=False, seed=4, steps=40, crash=crash)
    assert crashes > 0
    truth = truth_of(driver)
    words = driver.table("word_counts")
    assert all(words.get(k, 0) >= v for k, v in expected_tables(truth)["word_counts"].items())
    assert set(settled(driver)) == set(truth.pairs)
    assert len(driver.dead_letters("item-events")) >= 8


@pytest.mark.parametrize("exactly_once", [True, False])
def test_every_record_of_the_bad_input_corpus_is_dead_lettered_once(exactly_once: bool) -> None:
    """Every pipeline reading a topic judges its records alike, and one of them reports
    what it refuses: an item event that three pipelines read is dead-lettered once, even
    when the fast reader cannot read it at all (not UTF-8, nested too deep)."""
    driver = TestDriver(*DEMO, partitions=PARTITIONS, exactly_once=exactly_once)
    corpus = build_corpus()
    for record in corpus:
        driver.produce(record.topic, record.value, key=record.key)
    driver.run()
    for topic in ("text-lines", "item-events", "payments", "products"):
        sent = Counter((r.key, r.value) for r in corpus if r.topic == topic)
        letters = driver.dead_letters(topic)
        assert Counter((d.key, d.value) for d in letters) == sent, topic
        reasons = [d.reason for d in letters]
        assert all(reason and "processing failed" not in reason for reason in reasons), topic
    assert driver.table("inventory") == {}
