"""The recompute's transforms on a local Spark, against the stream's own functions."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

import orjson
import pytest

from app import semantics
from jobs import compare, transforms

pytestmark = pytest.mark.batch

HOUR = semantics.HOUR_MS
T0 = 1_700_000_000_000 - 1_700_000_000_000 % HOUR

LINES = [
    "L'état du magasin change à chaque vente",
    "Die Straße vor dem Laden ist heute voller Kunden",
    "ΣΟΦΙΑ counts words in Greek too",
    "don't panic: user_42 restocked 12 items at 09:30",
    "The quick brown fox, the LAZY dog_2",
    "İstanbul ǅemal ﬁne ⅷ x²³ ٣٤ 東京タワー",
    "tabs\tand\nnewlines\r\n__init__ -- --- a_b",
    "emoji 🙂 and ZWJ 👩‍👩‍👧 mixed_ÀÉ",
    "   ",
    "",
]


def kafka_rows(spark: Any, rows: list[tuple[Any, ...]]) -> Any:
    """A frame with the Kafka source's columns: (key, value, offset, timestamp ms)."""
    data = [
        (key, value, "t", 0, offset, dt.datetime.fromtimestamp(ts / 1000, dt.UTC), 0)
        for key, value, offset, ts in rows
    ]
    return spark.createDataFrame(data, transforms_schema())


def transforms_schema() -> str:
    from jobs.io import KAFKA_SCHEMA

    return KAFKA_SCHEMA


def lines_frame(spark: Any, values: Sequence[bytes | None]) -> Any:
    return kafka_rows(spark, [(None, v, i, T0) for i, v in enumerate(values)])


def test_tokens_equal_python_unicode_rule_for_any_text(spark: Any) -> None:
    values = [line.encode("utf-8") for line in LINES]
    batch = sorted(r["word"] for r in transforms.words(lines_frame(spark, values)).collect())
    stream = sorted(t for line in LINES for t in semantics.tokenize(line))
    assert batch == stream
    assert {"état", "straße", "σοφια", "don", "t", "user_42", "09", "30", "dog_2"} <= set(batch)


def test_invalid_lines_count_nothing(spark: Any) -> None:
    values = [None, b"\xff\xfe not utf-8", b"caf\xc3", b"word " * 20_000, b"valid words"]
    counts = transforms.word_counts(lines_frame(spark, values)).collect()
    assert {r["key"]: r["count"] for r in counts} == {"valid": 1, "words": 1}


def test_ascii_and_unicode_lines_count_the_same_word_together(spark: Any) -> None:
    values = [b"the cafe", "the café".encode(), b"THE"]
    counts = {
        r["key"]: r["count"] for r in transforms.word_counts(lines_frame(spark, values)).collect()
    }
    assert counts == {"the": 3, "cafe": 1, "café": 1}


def event(store: str, sku: str, kind: str, qty: int, ts: int, price: float | None = None) -> bytes:
    body: dict[str, Any] = {
        "event_id": f"{store}-{sku}-{ts}-{kind}",
        "store_id": store,
        "sku": sku,
        "kind": kind,
        "quantity": qty,
        "ts": ts,
    }
    if price is not None:
        body["unit_price"] = price
    return orjson.dumps(body)


def test_inventory_sums_deltas_and_keeps_the_latest_ts(spark: Any) -> None:
    rows = [
        (b"s1", event("s1", "a", "restock", 10, T0 + 5), 0, T0),
        (b"s1", event("s1", "a", "sale", 3, T0 + 9, 2.5), 1, T0),
        (b"s1", event("s1", "b", "adjust", -2, T0 + 7), 2, T0),
        (b"s1", event("s1", "b", "adjust", 2, T0 + 1), 3, T0),
        (b"s2", event("s1", "a", "restock", 99, T0 + 99), 4, T0),  # key != store_id: DLQ
        (b"s1", b'{"event_id": "x"}', 5, T0),  # invalid: DLQ
        (b"s1", event("s1", "a", "sale", 1, T0 + 3), 6, T0),  # sale without price: DLQ
    ]
    events = transforms.item_events(kafka_rows(spark, rows))
    [row] = transforms.inventory(events).collect()
    assert row["key"] == "s1"
    assert dict(row["on_hand"]) == {"a": 7, "b": 0}
    assert row["updated_at"] == T0 + 9


def product(sku: str, category: str) -> bytes:
    return orjson.dumps({"sku": sku, "name": sku, "category": category})


def test_sales_take_the_category_of_the_latest_product_version_at_their_time(spark: Any) -> None:
    versions = kafka_rows(
        spark,
        [
            (b"a", product("a", "dairy"), 0, T0 + 100),
            (b"a", product("a", "bakery"), 1, T0 + 200),
            (b"a", product("a", "drinks"), 2, T0 + 200),  # same time, higher offset wins
            (b"a", None, 3, T0 + 300),  # deleted
            (b"b", product("x", "wrong"), 4, T0),  # key != sku: skipped
        ],
    )
    events = kafka_rows(
        spark,
        [
            (b"s", event("s", "a", "sale", 1, T0 + 50, 1.0), 0, 0),  # before any version
            (b"s", event("s", "a", "sale", 2, T0 + 100, 1.0), 1, 0),  # at the version's time
            (b"s", event("s", "a", "sale", 3, T0 + 250, 1.0), 2, 0),
            (b"s", event("s", "a", "sale", 4, T0 + 300, 1.0), 3, 0),  # deleted at that time
            (b"s", event("s", "b", "sale", 5, T0 + HOUR, 0.5), 4, 0),  # next hour, no product
            (b"s", event("s", "a", "restock", 9, T0 + 250), 5, 0),  # not a sale
        ],
    )
    sales = transforms.enrich_sales(
        transforms.item_events(events), transforms.product_versions(versions)
    )
    view = {
        r["key"]: (r["units"], r["revenue"]) for r in transforms.sales_by_category(sales).collect()
    }
    assert view == {
        f"unknown@{T0}": (5, 5.0),
        f"dairy@{T0}": (2, 2.0),
        f"drinks@{T0}": (3, 3.0),
        f"unknown@{T0 + HOUR}": (5, 2.5),
    }


def changelog(spark: Any, records: list[tuple[bytes, bytes | None]]) -> Any:
    return kafka_rows(spark, [(k, v, i, T0) for i, (k, v) in enumerate(records)])


def test_latest_value_per_key_and_tombstones_remove_keys(spark: Any) -> None:
    frame = changelog(spark, [(b"a", b"1"), (b"b", b"2"), (b"a", b"3"), (b"b", None)])
    assert [(r["key"], r["count"]) for r in transforms.stream_word_counts(frame).collect()] == [
        ("a", 3)
    ]


def test_windowed_changelog_keys_become_category_at_window_start(spark: Any) -> None:
    start_s = T0 / 1000
    key = orjson.dumps(["crème", [start_s, start_s + 3600 - 0.1]])
    frame = changelog(spark, [(key, b'{"units": 2, "revenue": 3.5}')])
    [row] = transforms.stream_sales_by_category(frame).collect()
    assert (row["key"], row["window_start"], row["units"]) == (f"crème@{T0}", T0, 2)


def test_compare_finds_each_kind_of_difference_and_tolerates_revenue_rounding(
    spark: Any,
) -> None:
    spec = compare.specs("streamstate")["sales_by_category"]
    batch = spark.createDataFrame(
        [
            (f"a@{T0}", "a", T0, 3, 0.1 + 0.2),
            (f"b@{T0}", "b", T0, 1, 1.0),
            (f"c@{T0}", "c", T0, 1, 1.0),
        ],
        "key string, category string, window_start long, units long, revenue double",
    )
    stream = spark.createDataFrame(
        [
            (f"a@{T0}", "a", T0, 3, 0.3, '{"units":3,"revenue":0.3}'),
            (f"b@{T0}", "b", T0, 2, 1.0, '{"units":2,"revenue":1.0}'),
            (f"d@{T0}", "d", T0, 1, 1.0, '{"units":1,"revenue":1.0}'),
        ],
        "key string, category string, window_start long, units long, revenue double, raw string",
    )
    differences = compare.diff(spec, batch, stream)
    entry = compare.summarize(differences, examples=10)
    assert (entry["keys_compared"], entry["mismatched"]) == (4, 1)
    assert (entry["missing_in_stream"], entry["missing_in_batch"]) == (1, 1)
    records = {k: orjson.loads(v) for k, v in compare.corrections(spec, differences)}
    assert records[b"b"] == {
        "table": "sales_by_category",
        "key": f"b@{T0}",
        "value": {"units": 1, "revenue": 1.0},
        "expected": {"units": 2, "revenue": 1.0},
    }
    assert records[b"c"]["value"] == {"units": 1, "revenue": 1.0}
    assert records[b"c"]["expected"] is None
    assert records[b"d"]["value"] is None
