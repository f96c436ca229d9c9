"""The nightly recompute against a real Kafka, a real worker and a local Spark.

One worker (exactly_once) processes generated data for the demo pipelines; the job must
find no difference once the worker has caught up, find drift written straight into the
changelogs exactly, repair it through ``corrections`` (which the worker applies), and
find nothing on the next run.
"""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from agents.schemas import demo_topic_specs
from agents.words import tokenize
from core.admin import ensure_topics
from core.topics import partition_for
from jobs.cut import take_cut
from jobs.recompute import EXIT_DIFFERS, EXIT_SAME, Options, run
from ops.generator import SENTENCES, Catalogue, item_event
from tables.windows import window_key
from tests.support.kafka import ROOT, TEST_PORT, LocalKafka, local_kafka
from tests.support.kafka_io import changelog_state, wait_for
from tests.support.workers import Worker

pytestmark = [pytest.mark.batch, pytest.mark.integration]

PORT = TEST_PORT + 2600
PARTITIONS = 8
HOUR_MS = 3_600_000
EXTRA_LINES = [
    "İstanbul ǅemal ﬁne x²³ ٣٤ 東京タワー",
    "O'Brien's café: ÉTAT, État, état; straße STRASSE",
    "snake_case __dunder__ 3rd_place 2024-01-01",
]
Sent = tuple[str, bytes | None, bytes | None, int | None]


@pytest.fixture(scope="module")
def kafka() -> Iterator[LocalKafka]:
    with local_kafka("batch-recompute", port=PORT) as cluster:
        yield cluster


def send(bootstrap: str, records: list[Sent], timestamp_ms: int | None = None) -> None:
    """Produce (topic, key, value, partition) records."""

    async def go() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
        await producer.start()
        try:
            for topic, key, value, partition in records:
                await producer.send_and_wait(
                    topic, value, key=key, partition=partition, timestamp_ms=timestamp_ms
                )
        finally:
            await producer.stop()

    asyncio.run(go())


def partition_of(key: bytes) -> int:
    return partition_for(key, PARTITIONS)


def payment(sale: dict[str, Any], n: int, delay_ms: int) -> bytes:
    return orjson.dumps(
        {
            "payment_id": f"p{n}",
            "sale_event_id": sale["event_id"],
            "store_id": sale["store_id"],
            "amount": sale["quantity"] * sale["unit_price"],
            "ts": sale["ts"] + delay_ms,
        }
    )


@pytest.fixture(scope="module")
def worker(kafka: LocalKafka, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Worker]:
    bootstrap = kafka.bootstrap
    asyncio.run(ensure_topics(bootstrap, demo_topic_specs(PARTITIONS, -1), 1))
    rng = random.Random(7)
    catalogue = Catalogue.build(rng)
    now = int(time.time() * 1000)
    # The catalogue first, dated before every sale: a sale takes the category of the
    # product version whose record timestamp is at or before the sale's ts.
    send(
        bootstrap,
        [
            ("products", sku.encode(), orjson.dumps(p), None)
            for sku, p in catalogue.products.items()
        ],
        timestamp_ms=now - 3 * HOUR_MS,
    )
    datadir = tmp_path_factory.mktemp("recompute") / "worker-1"
    node = Worker(kafka, datadir, extra_env={"PROCESSING_GUARANTEE": "exactly_once"}).start()
    node.wait_ready()
    records: list[Sent] = []
    for n in range(300):
        event = item_event(rng, catalogue, now - rng.randint(0, 2 * HOUR_MS))
        records.append(("item-events", event["store_id"].encode(), orjson.dumps(event), None))
        if event["kind"] == "sale" and n % 3:
            paid = payment(event, n, rng.randint(0, 15 * 60_000))
            records.append(("payments", event["store_id"].encode(), paid, None))
        line = (SENTENCES + EXTRA_LINES)[n % (len(SENTENCES) + len(EXTRA_LINES))]
        records.append(("text-lines", None, line.encode(), None))
    # Records the stream sends to the DLQ; the batch must skip them the same way.
    records += [
        ("text-lines", None, b"\xff\xfe not UTF-8", None),
        ("text-lines", None, b"big " * 20_000, None),
        ("item-events", b"store-001", b'{"event_id": "x", "kind": "sale"}', None),
    ]
    send(bootstrap, records)
    try:
        yield node
    finally:
        node.stop()


@pytest.fixture(scope="module")
def options(kafka: LocalKafka, tmp_path_factory: pytest.TempPathFactory) -> Options:
    return Options(
        bootstrap=kafka.bootstrap,
        out=tmp_path_factory.mktemp("recompute-out"),
        master=None,
        settle_s=180.0,
        partitions=PARTITIONS,
    )


def report(options: Options) -> dict[str, Any]:
    result: dict[str, Any] = orjson.loads((options.out / "report.json").read_bytes())
    return result


def test_no_difference_once_the_exactly_once_worker_has_caught_up(
    spark: Any, worker: Worker, options: Options
) -> None:
    assert run(options, spark) == EXIT_SAME
    result = report(options)
    assert result["cut_settled"] is True
    assert result["group_members"] >= 1
    assert sum(result["cut"]["item-events"].values()) == 301
    tables = result["tables"]
    assert set(tables) == {"word_counts", "inventory", "sales_by_category", "unsettled_sales"}
    assert tables["inventory"]["keys_compared"] == 12
    assert tables["word_counts"]["keys_compared"] > 50
    assert tables["sales_by_category"]["keys_compared"] >= 10
    assert tables["unsettled_sales"]["keys_compared"] >= 1
    for entry in tables.values():
        assert entry["mismatched"] == entry["missing_in_stream"] == entry["missing_in_batch"] == 0
    assert result["not_recomputed"] == []


async def _commit_start(bootstrap: str, group: str) -> None:
    """Leave ``group`` behind on text-lines with no member: offset 0 committed, then gone."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group)
    await consumer.start()
    try:
        tp = TopicPartition("text-lines", 0)
        consumer.assign([tp])
        await consumer.commit({tp: 0})
    finally:
        await consumer.stop()


def test_the_cut_does_not_wait_for_a_group_with_no_worker(
    worker: Worker, kafka: LocalKafka
) -> None:
    asyncio.run(_commit_start(kafka.bootstrap, "nobody-home"))
    cut = asyncio.run(
        take_cut(kafka.bootstrap, ["text-lines"], [], [], "nobody-home", settle_s=3600.0)
    )
    # Lag that nobody will ever read: reported, not waited for (pytest's timeout would
    # stop a wait of an hour).
    assert cut.group_members == 0
    assert cut.settled is False
    assert cut.group_lag["text-lines"] > 0


def test_non_ascii_text_gives_identical_tokens_in_stream_and_batch(
    spark: Any, worker: Worker, options: Options, kafka: LocalKafka
) -> None:
    batch = {
        r["key"]: orjson.loads(r["value"])
        for r in spark.read.parquet(str(options.out / "word_counts")).collect()
    }
    stream = {k.decode(): v for k, v in changelog_state(kafka.bootstrap, "word_counts").items()}
    assert batch == stream
    assert {"état", "straße", "ǆemal", "東京タワー", "o", "brien", "s"} <= set(batch)
    for line in EXTRA_LINES:
        assert set(tokenize(line)) <= set(batch)
    assert {"snake_case", "__dunder__", "3rd_place"} <= set(batch)


def inject_drift(kafka: LocalKafka, options: Options) -> dict[str, Any]:
    """Write wrong values straight into the changelogs; return what was written."""
    from pyspark.sql import SparkSession

    session = SparkSession.getActiveSession()
    assert session is not None
    sales = sorted(
        (r["key"], r["window_start"], orjson.loads(r["value"]))
        for r in session.read.parquet(str(options.out / "sales_by_category")).collect()
        if r["key"] != "unknown"
    )
    category, start, value = sales[0]
    sales_key = window_key(category, start, 3600.0)
    wrong_sales = {"units": value["units"] + 1, "revenue": value["revenue"]}
    store = b"store-001"
    records: list[Sent] = [
        ("streamstate-word_counts-changelog", b"fox", b"999999", partition_of(b"fox")),
        ("streamstate-word_counts-changelog", b"phantomword", b"5", partition_of(b"phantomword")),
        ("streamstate-word_counts-changelog", b"the", None, partition_of(b"the")),
        (
            "streamstate-inventory-changelog",
            store,
            orjson.dumps({"store_id": "store-001", "on_hand": {"X": 1}, "updated_at": 1}),
            partition_of(store),
        ),
        (
            "streamstate-sales_by_category-changelog",
            sales_key,
            orjson.dumps(wrong_sales),
            partition_of(category.encode()),
        ),
    ]
    send(kafka.bootstrap, records)
    return {"category": category, "start": start}


def test_injected_drift_is_found_exactly_and_repaired(
    spark: Any, worker: Worker, options: Options, kafka: LocalKafka
) -> None:
    worker.stop()
    injected = inject_drift(kafka, options)
    worker.start()
    worker.wait_ready()

    repair = Options(**{**options.__dict__, "repair": True})
    assert run(repair, spark) == EXIT_DIFFERS
    tables = report(options)["tables"]
    words = tables["word_counts"]
    assert (words["mismatched"], words["missing_in_stream"], words["missing_in_batch"]) == (1, 1, 1)
    assert {(e["key"], e["status"]) for e in words["examples"]} == {
        ("fox", "mismatched"),
        ("the", "missing_in_stream"),
        ("phantomword", "missing_in_batch"),
    }
    assert [e["key"] for e in tables["inventory"]["examples"]] == ["store-001"]
    assert tables["inventory"]["mismatched"] == 1
    [sales] = tables["sales_by_category"]["examples"]
    assert (sales["key"], sales["status"]) == (injected["category"], "mismatched")
    assert sales["window"] == {"start": injected["start"], "end": injected["start"] + HOUR_MS}
    assert report(options)["corrections_published"] == 5

    # The worker applies the corrections; the next run finds nothing.
    wait_for(lambda: b"phantomword" not in changelog_state(kafka.bootstrap, "word_counts"), 90)
    assert run(options, spark) == EXIT_SAME
    state = changelog_state(kafka.bootstrap, "word_counts")
    assert state[b"fox"] != 999999


def test_command_line_exits_zero_when_nothing_differs(
    worker: Worker, kafka: LocalKafka, tmp_path: Path
) -> None:
    command = [sys.executable, "-m", "jobs.recompute", "--bootstrap", kafka.bootstrap]
    command += ["--out", str(tmp_path), "--master", "local[2]", "--shuffle-partitions", "4"]
    done = subprocess.run(
        command,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == EXIT_SAME, done.stderr[-3000:]
    assert "no differences (exit 0)" in done.stdout
    assert "word_counts" in done.stdout
    assert (tmp_path / "report.json").exists()
    assert (tmp_path / "inventory").is_dir()
