"""Bad input: a generated corpus of malformed records on every source topic.

Pass: every record reaches ``<source>-dlq`` exactly once with its key, value and an
``error`` header; no agent crashes or restarts; no table changes.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from chaos import corpus
from chaos.env import crashes, group, scan, wait_for, workdir
from tests.support.kafka import LocalKafka
from tests.support.kafka_io import Record, changelog_state, produce, read_topic

PRODUCTS = [
    {"sku": "DAI-1", "name": "milk", "category": "dairy"},
    {"sku": "BAK-1", "name": "baguette", "category": "bakery"},
]
LINES = ["the good line", "another good line"]
TABLES = ["word_counts", "inventory", "unsettled_sales", "sales_by_category"]
SOURCES = ["text-lines", "item-events", "payments", "products"]


def _events(now_ms: int) -> list[dict[str, Any]]:
    return [
        {
            "event_id": f"ok-{n}",
            "store_id": f"store-0{n % 2}",
            "sku": "DAI-1",
            "kind": "restock",
            "quantity": 5 + n,
            "ts": now_ms,
        }
        for n in range(6)
    ]


def run(kafka: LocalKafka, scale: int = 1, seed: int = 13) -> dict[str, Any]:
    """Produce the corpus to a running group and follow it into the dead-letter topics.

    The topics may hold earlier records: tables are compared before and after.
    """
    records = corpus.build(seed, scale)
    with group(kafka, workdir("bad-input")) as workers:
        worker = workers.add("w0")
        worker.wait_ready(240)
        _seed(kafka)
        before = _settled_tables(kafka)
        products_before = scan(worker, "products")
        started = time.monotonic()
        offsets_before = {t: _positions(read_topic(kafka.bootstrap, t)) for t in SOURCES}
        for topic in SOURCES:
            batch = [(r.key, r.value) for r in records if r.topic == topic]
            produce(kafka.bootstrap, topic, batch)
        expected = {t: sum(1 for r in records if r.topic == t) for t in SOURCES}
        dead = wait_for(lambda: _complete(kafka, expected), 300, 3.0) or _dead(kafka)
        elapsed = time.monotonic() - started
        time.sleep(5)  # anything still changing a table would show by now
        after = _tables(kafka)
        products_after = scan(worker, "products")
        agent_crashes = crashes(worker)
        alive = worker.alive()
    return _figures(
        kafka,
        records,
        expected,
        dead,
        offsets_before,
        before,
        after,
        products_before == products_after,
        agent_crashes,
        alive,
        elapsed,
    )


def _seed(kafka: LocalKafka) -> None:
    """Valid records first (so the compared tables are not empty), marked to be found."""
    now = int(time.time() * 1000)
    marker = f"seed{now}"
    produce(kafka.bootstrap, "products", [(p["sku"], p) for p in PRODUCTS], now - 3_600_000)
    produce(kafka.bootstrap, "text-lines", [(None, f"{line} {marker}") for line in LINES])
    events = _events(now)
    events[-1]["store_id"] = marker
    produce(kafka.bootstrap, "item-events", [(e["store_id"], e) for e in events])
    ok = wait_for(
        lambda: (
            changelog_state(kafka.bootstrap, "word_counts").get(marker.encode()) == 2
            and marker.encode() in changelog_state(kafka.bootstrap, "inventory")
        ),
        180,
        2.0,
    )
    if not ok:
        raise RuntimeError("the seed records never reached the tables")


def _settled_tables(
    kafka: LocalKafka, quiet_s: float = 5.0, timeout: float = 120.0
) -> dict[str, Any]:
    """The tables once two reads ``quiet_s`` apart agree. The seed's marker store can be
    applied before its other stores (other partitions, other batches): a snapshot taken
    at once could miss them, and their late writes would look like a change made by the
    bad records."""
    deadline = time.monotonic() + timeout
    last = _tables(kafka)
    while True:
        time.sleep(quiet_s)
        now = _tables(kafka)
        if now == last or time.monotonic() > deadline:
            return now
        last = now


def _tables(kafka: LocalKafka) -> dict[str, Any]:
    return {t: changelog_state(kafka.bootstrap, t) for t in TABLES}


def _positions(records: list[Record]) -> set[tuple[int, int]]:
    return {(r.partition, r.offset) for r in records}


def _dead(kafka: LocalKafka) -> dict[str, list[Record]]:
    return {t: read_topic(kafka.bootstrap, f"{t}-dlq") for t in SOURCES}


def _complete(kafka: LocalKafka, expected: dict[str, int]) -> dict[str, list[Record]] | None:
    dead = _dead(kafka)
    done = all(len(dead[t]) >= n for t, n in expected.items())
    return dead if done else None


def _figures(
    kafka: LocalKafka,
    records: list[corpus.BadRecord],
    expected: dict[str, int],
    dead: dict[str, list[Record]],
    offsets_before: dict[str, set[tuple[int, int]]],
    before: dict[str, Any],
    after: dict[str, Any],
    products_unchanged: bool,
    agent_crashes: int,
    alive: bool,
    elapsed: float,
) -> dict[str, Any]:
    per_topic: dict[str, Any] = {}
    for topic in SOURCES:
        sources = [
            r
            for r in read_topic(kafka.bootstrap, topic)
            if (r.partition, r.offset) not in offsets_before[topic]
        ]
        per_topic[topic] = _match(topic, sources, dead[topic])
    kinds = Counter(r.kind for r in records)
    in_dlq = sum(p["in_dlq"] for p in per_topic.values())
    changed = [t for t in TABLES if before[t] != after[t]]
    if not products_unchanged:
        changed.append("products")
    return {
        "records": len(records),
        "by_kind": dict(sorted(kinds.items())),
        "by_topic": expected,
        "in_dlq": in_dlq,
        "in_dlq_pct": round(100.0 * in_dlq / len(records), 2),
        "per_topic": per_topic,
        "agent_crashes": agent_crashes,
        "worker_alive": alive,
        "tables_changed": changed,
        "seconds_to_dead_letter_all": round(elapsed, 1),
    }


def _match(topic: str, sources: list[Record], dead: list[Record]) -> dict[str, Any]:
    """Match dead letters to the corpus records by their source partition and offset."""
    by_position = {(r.partition, r.offset): r for r in sources}
    seen: Counter[tuple[int, int]] = Counter()
    without_error = wrong_copy = foreign = 0
    for letter in dead:
        h = letter.headers
        position = (int(h.get("source-partition", b"-1")), int(h.get("source-offset", b"-1")))
        original = by_position.get(position)
        if h.get("source-topic") != topic.encode() or original is None:
            foreign += 1
            continue
        seen[position] += 1
        if not h.get("error"):
            without_error += 1
        if (letter.key, letter.value) != (original.key, original.value):
            wrong_copy += 1
    return {
        "produced": len(sources),
        "in_dlq": len(seen),
        "missing": len(set(by_position) - set(seen)),
        "duplicates": sum(n - 1 for n in seen.values()),
        "without_error_header": without_error,
        "not_the_original_bytes": wrong_copy,
        "not_from_the_corpus": foreign,
    }
