"""The streaming core against a real Kafka and real worker processes.

The expected tables are computed here from the produced events, independently of the
workers, and compared with the latest values in the changelog topics.
"""

from __future__ import annotations

import asyncio
import random
import re
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient

from agents.sales import SALES_BY_CATEGORY
from api.peers import FORWARDED_HEADER
from core.topics import partition_for
from streams.compile import repartition_topic
from tests.support.kafka import LocalKafka, local_kafka
from tests.support.kafka_io import (
    changelog_records,
    changelog_state,
    committed_records,
    produce,
    read_topic,
    wait_equal,
    wait_for,
)
from tests.support.workers import TOPIC_PARTITIONS, Worker, stop_workers

pytestmark = pytest.mark.integration

HOUR_MS = 3_600_000
PRODUCTS = [
    {"sku": "DAI-1", "name": "milk", "category": "dairy"},
    {"sku": "BAK-1", "name": "baguette", "category": "bakery"},
    {"sku": "DRI-1", "name": "green tea", "category": "drinks"},
]
LINES = [
    "The quick brown fox jumps over the lazy dog",
    "L'état du magasin change à chaque vente",
    "Die Straße vor dem Laden",
    "ΣΟΦΙΑ counts words in Greek too",
    "don't panic: user_42 restocked 12 items at 09:30",
]


@pytest.fixture(scope="module")
def kafka() -> Iterator[LocalKafka]:
    with local_kafka("streaming") as cluster:
        yield cluster


def item_events(count: int, seed: int, stores: int = 6) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    now = int(time.time() * 1000)
    events = []
    for n in range(count):
        kind = rng.choice(["sale", "sale", "sale", "restock", "adjust"])
        sku = rng.choice([p["sku"] for p in PRODUCTS] + ["NOPE-9"])
        event: dict[str, Any] = {
            "event_id": f"{seed}-{n}",
            "store_id": f"store-{rng.randrange(stores):02d}",
            "sku": sku,
            "kind": kind,
            "quantity": rng.randint(1, 9) if kind != "adjust" else rng.choice([-2, -1, 1, 3]),
            "ts": now - rng.randrange(2 * HOUR_MS),
        }
        if kind == "sale":
            event["unit_price"] = rng.choice([0.5, 1.25, 2.0, 9.99])
        events.append(event)
    return events


def expected_words(lines: list[str]) -> dict[bytes, int]:
    counts: Counter[str] = Counter()
    for line in lines:
        counts.update(t for t in re.split(r"\W+", line.lower()) if t)
    return {word.encode(): n for word, n in counts.items()}


def expected_inventory(events: list[dict[str, Any]]) -> dict[bytes, dict[str, Any]]:
    stores: dict[str, dict[str, Any]] = {}
    for e in events:
        store = stores.setdefault(e["store_id"], {"store_id": e["store_id"], "on_hand": {}})
        delta = -e["quantity"] if e["kind"] == "sale" else e["quantity"]
        store["on_hand"][e["sku"]] = store["on_hand"].get(e["sku"], 0) + delta
        store["updated_at"] = max(store.get("updated_at", 0), e["ts"])
    return {k.encode(): v for k, v in stores.items()}


def expected_sales(events: list[dict[str, Any]]) -> dict[tuple[str, float], dict[str, Any]]:
    categories = {p["sku"]: p["category"] for p in PRODUCTS}
    sales: dict[tuple[str, float], dict[str, Any]] = {}
    for e in events:
        if e["kind"] != "sale":
            continue
        start = (e["ts"] - e["ts"] % HOUR_MS) / 1000
        key = (categories.get(e["sku"], "unknown"), start)
        total = sales.setdefault(key, {"units": 0, "revenue": 0.0})
        total["units"] += e["quantity"]
        total["revenue"] += e["quantity"] * e["unit_price"]
    return sales


def sales_state(kafka: LocalKafka) -> dict[tuple[str, float], dict[str, Any]]:
    state = {}
    for key, value in changelog_state(kafka.bootstrap, "sales_by_category").items():
        category, (start, _end) = orjson.loads(key)
        state[(category, float(start))] = value
    return state


def assert_sales_equal(actual: dict[Any, Any], expected: dict[Any, Any]) -> None:
    assert actual.keys() == expected.keys()
    for key, value in expected.items():
        assert actual[key]["units"] == value["units"], key
        assert actual[key]["revenue"] == pytest.approx(value["revenue"]), key


def reset_topics(kafka: LocalKafka) -> None:
    """Each test starts from a fresh cluster: the module shares one broker process."""
    kafka.kill()
    import shutil

    shutil.rmtree(kafka.directory, ignore_errors=True)
    kafka.up()


def produce_workload(kafka: LocalKafka, events: list[dict[str, Any]], lines: list[str]) -> None:
    # A sale is enriched with the product version whose record timestamp precedes the
    # sale's event time: the catalogue is dated before the oldest generated sale.
    catalogue_time = int(time.time() * 1000) - 3 * HOUR_MS
    produce(kafka.bootstrap, "products", [(p["sku"], p) for p in PRODUCTS], catalogue_time)
    produce(kafka.bootstrap, "text-lines", [(None, line) for line in lines])
    produce(kafka.bootstrap, "item-events", [(e["store_id"], e) for e in events])


def restore_lines(worker: Worker) -> list[tuple[int, int]]:
    """(restore number, records read) of each restore the worker logged."""
    found = re.findall(r"restore (\d+) done: (\d+) changelog records", worker.log_text())
    return [(int(n), int(records)) for n, records in found]


def no_agent_crashed(worker: Worker) -> None:
    text = worker.log_text()
    # Every topic exists before the first assignment, so none is left out of it.
    assert "Ignoring missing topic" not in text
    assert "Crashed reason" not in text
    assert "Restarting dead" not in text


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
def test_tables_equal_the_events_under_each_guarantee(
    kafka: LocalKafka, tmp_path: Path, guarantee: str
) -> None:
    reset_topics(kafka)
    events = item_events(300, seed=7)
    lines = LINES * 20
    worker = Worker(kafka, tmp_path / "w", extra_env={"PROCESSING_GUARANTEE": guarantee}).start()
    try:
        worker.wait_ready()
        produce_workload(kafka, events, lines)
        words = lambda: changelog_state(kafka.bootstrap, "word_counts")  # noqa: E731
        wait_equal(words, expected_words(lines), 120, "word_counts")
        inventory = lambda: changelog_state(kafka.bootstrap, "inventory")  # noqa: E731
        wait_equal(inventory, expected_inventory(events), 120, "inventory")
        want_sales = expected_sales(events)
        wait_for(lambda: sales_state(kafka).keys() == want_sales.keys(), 90)
        wait_for(lambda: _sales_close(sales_state(kafka), want_sales), 30)
        assert_sales_equal(sales_state(kafka), want_sales)
        # Caught up, the group's committed offsets reach the end offsets, past the
        # transaction markers of the repartition topic under exactly_once: lag 0.
        lag = lambda: group_lag(kafka.bootstrap, "streamstate")  # noqa: E731
        wait_for(lambda: all(n == 0 for n in lag().values()), 30)
        assert repartition_topic("streamstate", SALES_BY_CATEGORY) in lag()
        no_agent_crashed(worker)
    finally:
        worker.stop()


def _sales_close(actual: dict[Any, Any], expected: dict[Any, Any]) -> bool:
    return all(actual.get(k, {}).get("units") == v["units"] for k, v in expected.items())


def test_bad_input_goes_to_the_dead_letter_topics_and_changes_no_table(
    kafka: LocalKafka, tmp_path: Path
) -> None:
    reset_topics(kafka)
    good = item_events(20, seed=11, stores=2)
    base = dict(good[0])
    bad_items: list[tuple[bytes | None, bytes, str]] = [
        (b"store-00", b"{broken json", "Invalid JSON"),
        (b"store-00", orjson.dumps({**base, "quantity": "3"}), "quantity"),
        (b"store-00", orjson.dumps({k: v for k, v in base.items() if k != "sku"}), "sku"),
        (b"store-00", orjson.dumps({**base, "kind": "sale", "quantity": -4}), "quantity must be"),
        (b"store-00", b"\xff\xfe\x00garbage", "not UTF-8"),
        (b"store-00", orjson.dumps({**base, "event_id": "x" * 70_000}), "exceeds the limit"),
        (b"store-99", orjson.dumps({**base, "store_id": "store-00"}), "does not match store_id"),
    ]
    bad_lines = [b"\xc3\x28 broken utf-8", b"y" * 70_000]
    bad_products = [(b"DAI-1", b'{"sku": "DAI-1"}'), (b"OTHER", orjson.dumps(PRODUCTS[1]))]
    worker = Worker(kafka, tmp_path / "w").start()
    try:
        worker.wait_ready()
        produce_workload(kafka, good, ["ok line"])
        produce(kafka.bootstrap, "item-events", [(k, v) for k, v, _ in bad_items])
        produce(kafka.bootstrap, "text-lines", [(None, v) for v in bad_lines])
        produce(kafka.bootstrap, "products", bad_products)
        produce(kafka.bootstrap, "text-lines", [(None, "last line")])

        dead = wait_for(lambda: _full(read_topic(kafka.bootstrap, "item-events-dlq"), 7), 60)
        by_value = {record.value: record for record in dead}
        for key, value, reason in bad_items:
            record = by_value[value]
            assert record.key == key
            assert reason in record.headers["error"].decode()
            assert record.headers["source-topic"] == b"item-events"
            source = read_topic(kafka.bootstrap, "item-events")
            original = next(r for r in source if r.value == value)
            assert record.headers["source-partition"] == str(original.partition).encode()
            assert record.headers["source-offset"] == str(original.offset).encode()
        dead_lines = wait_for(lambda: _full(read_topic(kafka.bootstrap, "text-lines-dlq"), 2), 60)
        assert sorted(r.value for r in dead_lines) == sorted(bad_lines)
        dead_products = wait_for(lambda: _full(read_topic(kafka.bootstrap, "products-dlq"), 2))
        assert {r.key for r in dead_products} == {b"DAI-1", b"OTHER"}

        want_words = expected_words(["ok line", "last line"])
        wait_for(lambda: changelog_state(kafka.bootstrap, "word_counts") == want_words, 60)
        assert changelog_state(kafka.bootstrap, "inventory") == expected_inventory(good)
        no_agent_crashed(worker)
    finally:
        worker.stop()


def _full(records: list[Any], count: int) -> list[Any] | None:
    return records if len(records) >= count else None


def test_restore_reads_the_whole_changelog_when_empty_and_only_the_tail_when_intact(
    kafka: LocalKafka, tmp_path: Path
) -> None:
    reset_topics(kafka)
    first = item_events(150, seed=3)
    a = Worker(kafka, tmp_path / "a").start()
    try:
        a.wait_ready()
        produce_workload(kafka, first, LINES)
        wait_for(
            lambda: changelog_state(kafka.bootstrap, "inventory") == expected_inventory(first), 90
        )
    finally:
        a.stop()
    records_before = changelog_records(kafka.bootstrap)

    # Empty data dir: everything from the changelog, every partition through the bulk read.
    b = Worker(kafka, tmp_path / "b").start()
    try:
        b.wait_ready()
        restores = restore_lines(b)
        assert restores, b.log_tail()
        assert sum(records for _, records in restores) == records_before
        bulk = re.findall(r"bulk restore: (\d+) changelog records", b.log_text())
        assert sum(int(n) for n in bulk) == records_before, b.log_tail()
        second = item_events(40, seed=4)
        produce(kafka.bootstrap, "item-events", [(e["store_id"], e) for e in second])
        want = expected_inventory(first + second)
        wait_for(lambda: changelog_state(kafka.bootstrap, "inventory") == want, 90)
    finally:
        b.stop()
    written_by_b = changelog_records(kafka.bootstrap) - records_before

    a.start()  # intact data dir: only what b wrote since a stopped
    try:
        a.wait_ready()
        restores = restore_lines(a)
        assert len(restores) >= 2, a.log_tail()
        assert 0 < restores[-1][1] <= written_by_b
        assert restores[-1][1] < records_before
        tails = re.findall(r"bulk restore: (\d+) changelog records", a.log_text())
        assert 0 < int(tails[-1]) <= written_by_b  # the tail, read in bulk too
        no_agent_crashed(a)
    finally:
        a.stop()


def test_a_joining_worker_copies_its_standbys_in_bulk_after_it_is_ready(
    kafka: LocalKafka, tmp_path: Path
) -> None:
    reset_topics(kafka)
    events = item_events(150, seed=7)
    want = expected_inventory(events)
    a = Worker(kafka, tmp_path / "a").start()
    b = Worker(kafka, tmp_path / "b")
    try:
        a.wait_ready()
        produce_workload(kafka, events, LINES)
        wait_for(lambda: changelog_state(kafka.bootstrap, "inventory") == want, 90)
        b.start()  # empty data dir: every partition it holds is copied from its changelog
        b.wait_ready()

        def standbys_caught_up() -> bool:
            status, report = b.get("/internal/console/worker")
            if status != 200:
                return False
            lags = [c["changelog_lag"] for c in report["copies"] if c["replica"] == "standby"]
            return bool(lags) and all(lag == 0 for lag in lags)

        wait_for(standbys_caught_up, 60)
        log = b.log_text()
        copied = [int(n) for n in re.findall(r"bulk standby copy: (\d+) changelog records", log)]
        assert sum(copied) > 0, b.log_tail()
        assert log.index("Worker ready") < log.index("bulk standby copy"), b.log_tail()
        # Each of b's copies, standbys included, holds the changelog's values: a forwarded
        # read is answered from the copy of the worker it is sent to.
        for store, value in want.items():
            request = urllib.request.Request(
                f"{b.url}/tables/inventory/keys/{store.decode()}",
                headers={FORWARDED_HEADER: a.url},
            )
            with urllib.request.urlopen(request, timeout=5) as answer:
                assert orjson.loads(answer.read())["value"] == value
        # What follows reaches b's standby copies as fetched: each fetched run is
        # written in one batch, not through faust's queue a record at a time.
        # Forty stores reach every partition of the inventory table, so some of them
        # reach the partitions of which b holds the standby copies.
        more = item_events(150, seed=8, stores=40)
        status, report = b.get("/internal/console/worker")
        assert status == 200, report
        standby = {
            c["partition"]
            for c in report["copies"]
            if c["replica"] == "standby" and c["table"] == "inventory"
        }
        touched = {partition_for(e["store_id"].encode(), TOPIC_PARTITIONS) for e in more}
        assert standby & touched, (standby, touched)
        later = expected_inventory(events + more)
        produce_workload(kafka, more, [])
        wait_for(lambda: changelog_state(kafka.bootstrap, "inventory") == later, 90)
        wait_for(lambda: all(read_forwarded(b, a, store) == v for store, v in later.items()), 60)
        assert written_to_standbys(b) > 0, b.log_tail()
        no_agent_crashed(b)
    finally:
        stop_workers([b, a])


def read_forwarded(worker: Worker, sender: Worker, store: bytes) -> Any:
    """The value ``worker``'s own copy holds for ``store`` (a read forwarded to it)."""
    request = urllib.request.Request(
        f"{worker.url}/tables/inventory/keys/{store.decode()}",
        headers={FORWARDED_HEADER: sender.url},
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:
            return orjson.loads(answer.read())["value"]
    except urllib.error.HTTPError:
        return None


def written_to_standbys(worker: Worker) -> float:
    status, text = worker.get("/metrics")
    assert status == 200
    name = "streamstate_standby_records_written_total "
    values = [line.split()[-1] for line in str(text).splitlines() if line.startswith(name)]
    return float(values[0]) if values else 0.0


WORDS_CHANGELOG = "streamstate-word_counts-changelog"


def active_partitions(worker: Worker, topic: str) -> dict[int, str]:
    """Each partition of ``topic`` and the URL of its active copy, as ``worker`` sees the
    group ({} while it cannot say)."""
    status, body = worker.get("/metadata")
    if status != 200:
        return {}
    return {p: host["url"] for host in body["hosts"] for p in host["active"].get(topic, [])}


def test_a_worker_stopped_with_sigterm_leaves_the_group_and_its_peer_takes_over(
    kafka: LocalKafka, tmp_path: Path
) -> None:
    """The stopped worker's partitions move to its peer at once. Neither the peers'
    probes (off) nor the session (60 s) can remove it within the wait below: only its
    own leave can."""
    env = {"BROKER_SESSION_TIMEOUT": "60", "STREAMSTATE_EVICT_DEAD_MEMBERS": "false"}
    reset_topics(kafka)
    a = Worker(kafka, tmp_path / "a", extra_env=env).start()
    b = Worker(kafka, tmp_path / "b", extra_env=env).start()
    try:
        a.wait_ready()
        b.wait_ready()
        both = {a.url, b.url}
        wait_for(lambda: set(active_partitions(a, WORDS_CHANGELOG).values()) == both, 60)
        assert b.stop()  # SIGTERM; stopped without being killed
        log, left = b.log_text(), f"left group streamstate as {b.url}"
        assert left in log, b.log_tail()
        # It leaves once its fetch loop has ended, before its tables close, and it
        # neither heartbeats nor joins again on its way out.
        assert log.index(left) < log.index("Closing rocksdb on stop"), b.log_tail()
        assert "Joined group" not in log[log.index(left) :], b.log_tail()

        def all_on_a() -> dict[int, str] | None:
            found = active_partitions(a, WORDS_CHANGELOG)
            return found if set(found.values()) == {a.url} else None

        every = wait_for(all_on_a, 30)
        assert sorted(every) == list(range(8)), a.log_tail()
        assert "refused" not in a.log_text()
        no_agent_crashed(a)
    finally:
        stop_workers([a, b])


def test_a_joining_worker_warms_up_before_partitions_move_to_it(
    kafka: LocalKafka, tmp_path: Path
) -> None:
    """A worker joining with an empty data dir gets standbys first; the partitions it
    is to own move once its copies have caught up, so it restores nothing then."""
    reset_topics(kafka)
    rng = random.Random(5)
    vocabulary = [f"w{n}" for n in range(3_000)]
    lines = [" ".join(rng.choice(vocabulary) for _ in range(8)) for _ in range(2_000)]
    want = expected_words(lines)
    # Below the records of each partition's changelog: a copy that has copied nothing is
    # not close enough.
    env = {"STREAMSTATE_ACCEPTABLE_RECOVERY_LAG": "50"}
    a = Worker(kafka, tmp_path / "a", extra_env=env).start()
    b = Worker(kafka, tmp_path / "b", extra_env=env)
    try:
        a.wait_ready()
        produce(kafka.bootstrap, "text-lines", [(None, line) for line in lines])
        wait_for(lambda: changelog_state(kafka.bootstrap, "word_counts") == want, 90)
        b.start()
        b.wait_ready()

        def b_owns() -> list[int] | None:
            found = [p for p, url in active_partitions(a, WORDS_CHANGELOG).items() if url == b.url]
            return found or None

        owned = wait_for(b_owns, 60)
        log = b.log_text()
        assert "warming up" in log, b.log_tail()
        assert "asking the group to rebalance" in log, b.log_tail()
        assert "assignment holds back" in a.log_text(), a.log_tail()
        copied = [int(n) for n in re.findall(r"bulk standby copy: (\d+) changelog records", log)]
        assert sum(copied) > 0, b.log_tail()
        # Every partition b owns came from a warm copy: no restore of b read a record.
        restores = restore_lines(b)
        assert restores, b.log_tail()
        assert [n for _, n in restores] == [0] * len(restores), b.log_tail()
        for word, count in sorted(want.items())[:300]:
            status, body = b.get(f"/tables/word_counts/keys/{word.decode()}")
            assert status == 200, body
            assert body["value"] == count
        assert len(owned) == 4
        no_agent_crashed(b)
    finally:
        stop_workers([b, a])


def test_an_exactly_once_restart_restores_every_table_before_it_goes_on(
    kafka: LocalKafka, tmp_path: Path
) -> None:
    # exactly_once rebuilds local tables from the changelogs at every start: a restore
    # that missed records would show as counts that restart from zero.
    reset_topics(kafka)
    first, second = item_events(150, seed=5), item_events(60, seed=6)
    env = {"PROCESSING_GUARANTEE": "exactly_once"}
    words = lambda: changelog_state(kafka.bootstrap, "word_counts")  # noqa: E731
    inventory = lambda: changelog_state(kafka.bootstrap, "inventory")  # noqa: E731
    worker = Worker(kafka, tmp_path / "a", extra_env=env).start()
    try:
        worker.wait_ready()
        produce_workload(kafka, first, LINES * 5)
        wait_equal(words, expected_words(LINES * 5), 120, "word_counts")
        wait_equal(inventory, expected_inventory(first), 120, "inventory")
    finally:
        worker.stop()
    worker.start()
    try:
        worker.wait_ready()
        produce(kafka.bootstrap, "text-lines", [(None, line) for line in LINES * 2])
        produce(kafka.bootstrap, "item-events", [(e["store_id"], e) for e in second])
        wait_equal(words, expected_words(LINES * 7), 120, "word_counts")
        wait_equal(inventory, expected_inventory(first + second), 120, "inventory")
        assert "bulk restore" in worker.log_text()
        no_agent_crashed(worker)
    finally:
        worker.stop()


def test_an_at_least_once_worker_restores_changelogs_written_under_exactly_once(
    kafka: LocalKafka, tmp_path: Path
) -> None:
    # Changelogs written in transactions end with commit markers, which are never
    # delivered as records: a restore must not wait for them, whatever the guarantee.
    reset_topics(kafka)
    events = item_events(80, seed=8)
    inventory = lambda: changelog_state(kafka.bootstrap, "inventory")  # noqa: E731
    worker = Worker(kafka, tmp_path / "eos", extra_env={"PROCESSING_GUARANTEE": "exactly_once"})
    worker.start()
    try:
        worker.wait_ready()
        produce_workload(kafka, events, LINES)
        wait_equal(inventory, expected_inventory(events), 120, "inventory")
    finally:
        worker.stop()
    fresh = Worker(kafka, tmp_path / "alo").start()  # an empty data dir: all from changelogs
    try:
        fresh.wait_ready(timeout=120)
        for store, value in expected_inventory(events).items():
            status, body = fresh.get(f"/tables/inventory/keys/{store.decode()}")
            assert (status, body["value"]) == (200, value)
        no_agent_crashed(fresh)
    finally:
        fresh.stop()


def group_lag(bootstrap: str, group: str) -> dict[str, int]:
    """End offset minus ``group``'s committed offset, summed per topic it committed
    (``kafka-consumer-groups.sh --describe``'s LAG: transaction markers count)."""

    async def read() -> dict[str, int]:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
        await admin.start()
        await consumer.start()
        try:
            committed = await admin.list_consumer_group_offsets(group)
            ends = await consumer.end_offsets(list(committed))
        finally:
            await consumer.stop()
            await admin.close()
        lag: Counter[str] = Counter()
        for tp, meta in committed.items():
            lag[tp.topic] += ends[tp] - meta.offset
        return dict(lag)

    return asyncio.run(read())


def test_a_kill9_mid_split_loses_and_duplicates_no_word_under_exactly_once(
    kafka: LocalKafka, tmp_path: Path
) -> None:
    # Each partition's task commits its table writes, outputs and offsets in one
    # transaction: a kill -9 between its transactions, or inside one, must leave every
    # line counted once after the restart. Small fetches make many small transactions,
    # so the kill lands mid-stream.
    reset_topics(kafka)
    lines = LINES * 4000
    env = {"PROCESSING_GUARANTEE": "exactly_once", "STREAMSTATE_SOURCE_FETCH_MAX_RECORDS": "200"}
    split = lambda: committed_records(kafka.bootstrap, "streamstate", "text-lines")  # noqa: E731
    worker = Worker(kafka, tmp_path / "w", extra_env=env).start()
    try:
        worker.wait_ready()
        produce(kafka.bootstrap, "text-lines", [(None, line) for line in lines])
        at_kill = wait_for(lambda: split() or None, 60, interval=0.05)
        worker.kill9()
    finally:
        worker.stop()
    assert 0 < at_kill < len(lines)
    worker.start()
    try:
        worker.wait_ready()
        words = lambda: changelog_state(kafka.bootstrap, "word_counts")  # noqa: E731
        wait_equal(words, expected_words(lines), 180, "word_counts")
        wait_equal(split, len(lines), 30, "committed offsets of text-lines")
        no_agent_crashed(worker)
    finally:
        worker.stop()


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
def test_three_workers_share_the_work_and_every_one_enriches_from_the_catalogue(
    kafka: LocalKafka, tmp_path: Path, guarantee: str
) -> None:
    reset_topics(kafka)
    events = item_events(240, seed=21, stores=12)
    env = {"PROCESSING_GUARANTEE": guarantee}
    workers = [Worker(kafka, tmp_path / f"w{n}", extra_env=env).start() for n in range(3)]
    try:
        for worker in workers:
            worker.wait_ready(timeout=180)
        produce_workload(kafka, events, LINES * 4)
        words = lambda: changelog_state(kafka.bootstrap, "word_counts")  # noqa: E731
        wait_equal(words, expected_words(LINES * 4), 120, "word_counts")
        want_sales = expected_sales(events)
        wait_for(lambda: sales_state(kafka).keys() == want_sales.keys(), 120)
        wait_for(lambda: _sales_close(sales_state(kafka), want_sales), 60)
        assert_sales_equal(sales_state(kafka), want_sales)
        want_inventory = expected_inventory(events)
        wait_for(lambda: changelog_state(kafka.bootstrap, "inventory") == want_inventory, 60)
        for worker in workers:
            assert "global table products: caught up" in worker.log_text()
            no_agent_crashed(worker)
    finally:
        stop_workers(workers)
