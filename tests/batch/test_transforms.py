"""The recompute's transforms on a local Spark, against the stream's own functions."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

import orjson
import pytest
from pyspark.sql import DataFrame
from pyspark.sql import functions as sf

from core import semantics
from jobs import compare, session, transforms

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
    totals = transforms.store_totals(events, transforms.product_versions(kafka_rows(spark, [])))
    [row] = transforms.inventory(totals).collect()
    assert row["key"] == "s1"
    assert dict(row["on_hand"]) == {"a": 7, "b": 0}
    assert row["updated_at"] == T0 + 9


def product(sku: str, category: str) -> bytes:
    return orjson.dumps({"sku": sku, "name": sku, "category": category})


def totals_of(events: Any, versions: Any, jvm: bool, max_bytes: int = 64 * 1024) -> Any:
    """The job's totals of ``events``: summed in the JVM (then the second pass), or by Spark
    SQL over the parsed events."""
    if not jvm:
        return transforms.store_totals(transforms.item_events(events, max_bytes), versions)
    first = transforms.plain_store_totals(events, versions, max_bytes)
    assert first is not None
    second = transforms.store_totals(transforms.other_events(events, max_bytes), versions)
    return transforms.merge_totals(first, second)


def store_views(totals: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    inventory = {
        r["key"]: (dict(r["on_hand"]), r["updated_at"])
        for r in transforms.inventory(totals).collect()
    }
    sales = {
        r["key"]: (r["units"], r["revenue"]) for r in transforms.sales_by_category(totals).collect()
    }
    return inventory, sales


@pytest.mark.parametrize("jvm", [True, False], ids=["jvm", "spark-sql"])
def test_sales_take_the_category_of_the_latest_product_version_at_their_time(
    spark: Any, jvm: bool
) -> None:
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
    _, view = store_views(totals_of(events, transforms.product_versions(versions), jvm))
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


def _sale(**fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "event_id": "e",
        "store_id": "s1",
        "sku": "a",
        "kind": "sale",
        "quantity": 2,
        "unit_price": 1.5,
        "ts": T0,
    }
    body.update(fields)
    return body


def _record(n: int, value: bytes | None, key: bytes | None = b"s1") -> tuple[Any, ...]:
    return (key, value, n, T0)


#: (description, key, value): item events in and out of the plain form, valid and not.
ITEM_RECORDS: list[tuple[str, bytes | None, bytes | None]] = [
    ("model order", b"s1", orjson.dumps(_sale(event_id="a1"))),
    (
        "other order",
        b"s1",
        b'{"ts":5,"kind":"sale","unit_price":2.25,"sku":"b","store_id":"s1","quantity":1,"event_id":"a2"}',
    ),
    (
        "spaces",
        b"s1",
        b'{ "event_id" : "a3", "store_id": "s1",\n\t"sku": "a", "kind": "restock",'
        b' "quantity": 7, "ts": 9 }\r\n',
    ),
    (
        "duplicate, last wins",
        b"s1",
        b'{"event_id":"a4","store_id":"s1","sku":"a","kind":"sale","quantity":0,"unit_price":1,"ts":1,"quantity":3,"ts":2}',
    ),
    (
        "duplicate of another type",
        b"s1",
        b'{"event_id":"a5","store_id":"s1","sku":"a","kind":"adjust","quantity":"x","quantity":-3,"ts":1}',
    ),
    ("escaped quote", b"s1", orjson.dumps(_sale(event_id='a6"q'))),
    (
        "escaped unicode",
        b"s1",
        b'{"event_id":"a7\\u00e9","store_id":"s1","sku":"a","kind":"restock","quantity":1,"ts":1}',
    ),
    ("non-ASCII store", "störe".encode(), orjson.dumps(_sale(event_id="a8", store_id="störe"))),
    (
        "extra field",
        b"s1",
        b'{"event_id":"a9","note":{"x":[1,2]},"store_id":"s1","sku":"a","kind":"restock","quantity":1,"ts":1}',
    ),
    ("integer price", b"s1", orjson.dumps(_sale(event_id="a10", unit_price=2))),
    (
        "null price on a restock",
        b"s1",
        b'{"event_id":"a11","store_id":"s1","sku":"a","kind":"restock","quantity":1,"unit_price":null,"ts":1}',
    ),
    (
        "sale without price",
        b"s1",
        b'{"event_id":"a12","store_id":"s1","sku":"a","kind":"sale","quantity":1,"ts":1}',
    ),
    ("null price on a sale", b"s1", orjson.dumps(_sale(event_id="a13", unit_price=None))),
    ("adjust by zero", b"s1", orjson.dumps(_sale(event_id="a14", kind="adjust", quantity=0))),
    ("adjust down", b"s1", orjson.dumps(_sale(event_id="a15", kind="adjust", quantity=-3))),
    ("negative sale", b"s1", orjson.dumps(_sale(event_id="a16", quantity=-1))),
    ("quantity too large", b"s1", orjson.dumps(_sale(event_id="a17", quantity=1_000_001))),
    ("quantity at the limit", b"s1", orjson.dumps(_sale(event_id="a18", quantity=1_000_000))),
    ("float quantity", b"s1", orjson.dumps(_sale(event_id="a19", quantity=1.0))),
    (
        "leading zero",
        b"s1",
        b'{"event_id":"a20","store_id":"s1","sku":"a","kind":"restock","quantity":01,"ts":1}',
    ),
    ("negative ts", b"s1", orjson.dumps(_sale(event_id="a21", ts=-1))),
    ("ts past year 9999", b"s1", orjson.dumps(_sale(event_id="a22", ts=253_402_300_800_000))),
    ("ts at the limit", b"s1", orjson.dumps(_sale(event_id="a23", ts=253_402_300_799_999))),
    (
        "huge ts",
        b"s1",
        b'{"event_id":"a24","store_id":"s1","sku":"a","kind":"restock","quantity":1,"ts":123456789012345678901234}',
    ),
    ("empty event_id", b"s1", orjson.dumps(_sale(event_id=""))),
    ("event_id of 256", b"s1", orjson.dumps(_sale(event_id="x" * 256))),
    ("event_id of 257", b"s1", orjson.dumps(_sale(event_id="y" * 257))),
    ("unknown kind", b"s1", orjson.dumps(_sale(event_id="a25", kind="return"))),
    ("upper-case kind", b"s1", orjson.dumps(_sale(event_id="a26", kind="SALE"))),
    ("key mismatch", b"s2", orjson.dumps(_sale(event_id="a27"))),
    ("no key", None, orjson.dumps(_sale(event_id="a28"))),
    ("price at the limit", b"s1", orjson.dumps(_sale(event_id="a29", unit_price=1e9))),
    ("price over the limit", b"s1", orjson.dumps(_sale(event_id="a30", unit_price=1.0000001e9))),
    (
        "negative zero price",
        b"s1",
        b'{"event_id":"a31","store_id":"s1","sku":"a","kind":"sale","quantity":1,"unit_price":-0.0,"ts":1}',
    ),
    ("negative price", b"s1", orjson.dumps(_sale(event_id="a32", unit_price=-0.5))),
    (
        "infinite price",
        b"s1",
        b'{"event_id":"a33","store_id":"s1","sku":"a","kind":"sale","quantity":1,"unit_price":1e400,"ts":1}',
    ),
    (
        "exponent price",
        b"s1",
        b'{"event_id":"a34","store_id":"s1","sku":"a","kind":"sale","quantity":1,"unit_price":1.5E-3,"ts":1}',
    ),
    (
        "string price",
        b"s1",
        b'{"event_id":"a35","store_id":"s1","sku":"a","kind":"sale","quantity":1,"unit_price":"2","ts":1}',
    ),
    (
        "number as string field",
        b"s1",
        b'{"event_id":36,"store_id":"s1","sku":"a","kind":"restock","quantity":1,"ts":1}',
    ),
    (
        "missing event_id",
        b"s1",
        b'{"store_id":"s1","sku":"a","kind":"restock","quantity":1,"ts":1}',
    ),
    ("trailing garbage", b"s1", orjson.dumps(_sale(event_id="a37")) + b"x"),
    ("trailing line separator", b"s1", orjson.dumps(_sale(event_id="a38")) + "\u2028".encode()),
    ("two objects", b"s1", orjson.dumps(_sale(event_id="a39")) * 2),
    ("an array", b"s1", b"[" + orjson.dumps(_sale(event_id="a40")) + b"]"),
    (
        "single quotes",
        b"s1",
        b"{'event_id':'a41','store_id':'s1','sku':'a','kind':'restock','quantity':1,'ts':1}",
    ),
    (
        "invalid UTF-8",
        b"s1",
        b'{"event_id":"a42\xff","store_id":"s1","sku":"a","kind":"restock","quantity":1,"ts":1}',
    ),
    (
        "control character",
        b"s1",
        b'{"event_id":"a43\x01","store_id":"s1","sku":"a","kind":"restock","quantity":1,"ts":1}',
    ),
    ("null value", b"s1", None),
    ("over the size limit", b"s1", orjson.dumps(_sale(event_id="z" * 200))),
    ("empty object", b"s1", b"{}"),
    ("not JSON", b"s1", b"sale of 2 apples"),
]
ITEM_MAX_BYTES = 200


def _python_item_event(key: bytes | None, value: bytes | None) -> tuple[Any, ...] | None:
    try:
        event = semantics.parse_item_event(value, ITEM_MAX_BYTES)
        semantics.check_key(key, event.store_id, "store_id")
    except semantics.InvalidEvent:
        return None
    return (
        event.event_id,
        event.store_id,
        event.sku,
        event.kind,
        event.quantity,
        event.unit_price,
        event.ts,
    )


def test_item_events_equal_the_stream_validation_in_and_out_of_the_plain_form(spark: Any) -> None:
    assert spark.catalog.functionExists(transforms.PLAIN_ITEM_EVENT_UDF)
    frame = kafka_rows(spark, [_record(n, v, k) for n, (_, k, v) in enumerate(ITEM_RECORDS)])
    stream = sorted(
        e for _, key, value in ITEM_RECORDS if (e := _python_item_event(key, value)) is not None
    )
    events = transforms.item_events(frame, ITEM_MAX_BYTES).drop("pending")
    batch = sorted(tuple(r) for r in events.collect())
    assert batch == stream
    # Both paths ran: valid and invalid events in and out of the plain form.
    parsed = frame.select("offset", transforms.plain_item_events(frame, ITEM_MAX_BYTES).alias("p"))
    verdicts = {r["offset"]: r["p"] and r["p"]["ok"] for r in parsed.collect()}
    named = {description: n for n, (description, _, _) in enumerate(ITEM_RECORDS)}
    for description in ("model order", "other order", "spaces", "duplicate, last wins"):
        assert verdicts[named[description]] is True, description
    for description in ("adjust by zero", "key mismatch", "event_id of 257", "infinite price"):
        assert verdicts[named[description]] is False, description
    for description in ("escaped quote", "non-ASCII store", "extra field", "string price"):
        assert verdicts[named[description]] is None, description
    assert ("a4", "s1", "a", "sale", 3, 1.0, 2) in batch
    assert ("a5", "s1", "a", "adjust", -3, None, 1) in batch
    assert len(stream) >= 15


def test_item_events_without_the_java_udf_are_all_parsed_in_python(spark: Any) -> None:
    frame = kafka_rows(spark, [_record(n, v, k) for n, (_, k, v) in enumerate(ITEM_RECORDS)])
    with_udf = sorted(tuple(r) for r in transforms.item_events(frame, ITEM_MAX_BYTES).collect())
    assert with_udf
    spark.sql(f"DROP TEMPORARY FUNCTION {transforms.PLAIN_ITEM_EVENT_UDF}")
    try:
        assert not spark.catalog.functionExists(transforms.PLAIN_ITEM_EVENT_UDF)
        rows = transforms.item_events(frame, ITEM_MAX_BYTES).collect()
    finally:
        assert session.register_udfs(spark)
    assert sorted(tuple(r) for r in rows) == with_udf


def test_store_totals_summed_in_the_jvm_equal_those_of_the_parsed_events(spark: Any) -> None:
    rows = [_record(n, v, k) for n, (_, k, v) in enumerate(ITEM_RECORDS)]
    frame = kafka_rows(spark, [*rows, (b"s1", b"not json", len(rows), T0)])
    versions = transforms.product_versions(
        kafka_rows(
            spark,
            [
                (b"a", product("a", "dairy"), 0, 0),
                (b"a", product("a", "bakery"), 1, 2),
                (b"b", None, 2, 0),
            ],
        )
    )
    first = transforms.plain_store_totals(frame, versions, ITEM_MAX_BYTES)
    assert first is not None
    outside = [d for d, k, v in ITEM_RECORDS if v is not None and len(v) <= ITEM_MAX_BYTES]
    assert 0 < transforms.pending_records(first) < len(outside)
    jvm = store_views(totals_of(frame, versions, True, ITEM_MAX_BYTES))
    assert jvm == store_views(totals_of(frame, versions, False, ITEM_MAX_BYTES))
    inventory, sales = jvm
    assert set(inventory) == {"s1", "störe"}
    assert {key.split("@")[0] for key in sales} == {"dairy", "bakery", "unknown"}


def test_store_totals_sent_on_whenever_the_maps_fill_up_add_up_the_same(spark: Any) -> None:
    rows = [
        (b"s1", event("s1", sku, kind, 2, T0 + n * 1000, 1.5 if kind == "sale" else None), n, T0)
        for n, (sku, kind) in enumerate([("a", "sale"), ("b", "restock"), ("c", "sale")] * 4)
    ]
    frame = kafka_rows(spark, [*rows, (b"s1", b"not json", len(rows), T0)]).repartition(2)
    versions = transforms.product_versions(kafka_rows(spark, [(b"a", product("a", "x"), 0, 0)]))
    summer = transforms.java_class(spark, "StoreTotals")
    spans = transforms.catalogue_spans(versions)
    jparts = summer.partial(frame._jdf, 64 * 1024, spans._jdf, "unknown", HOUR, 1)
    parts = DataFrame(jparts, spark)
    assert parts.count() > 6  # the maps were sent on after every key
    whole = transforms.plain_store_totals(frame, versions)
    assert whole is not None
    assert store_views(transforms.sum_totals(parts)) == store_views(whole)
    assert parts.agg(sf.sum("pending")).first()[0] == 1  # "not json", for the second pass


@pytest.mark.parametrize("jvm", [True, False], ids=["jvm", "spark-sql"])
def test_the_second_pass_adds_the_records_the_first_left_and_nothing_else(
    spark: Any, jvm: bool
) -> None:
    plain = [orjson.dumps(_sale(event_id=f"p{n}", sku="a", quantity=n % 3 + 1)) for n in range(6)]
    escaped = [orjson.dumps(_sale(event_id=f'q"{n}', sku="a", ts=T0 + HOUR)) for n in range(3)]
    restock = [
        b'{"event_id": "r", "note": 1, "store_id": "s1", "sku": "b", "kind": "restock",'
        b' "quantity": 9, "ts": 7}'
    ]
    invalid = [orjson.dumps(_sale(event_id="x", quantity=0)), b"not json"]
    values = plain + escaped + restock + invalid
    frame = kafka_rows(spark, [_record(n, v) for n, v in enumerate(values)])
    versions = transforms.product_versions(
        kafka_rows(spark, [(b"a", product("a", "dairy"), 0, T0 - HOUR)])
    )
    first = (
        transforms.plain_store_totals(frame, versions)
        if jvm
        else transforms.store_totals(transforms.plain_events(frame), versions)
    )
    assert first is not None
    first = first.persist()
    assert transforms.pending_records(first) == len(escaped) + len(restock) + 1  # "not json"
    second = transforms.store_totals(transforms.other_events(frame), versions)
    merged = transforms.merge_totals(first, second)
    whole = transforms.store_totals(transforms.item_events(frame), versions)

    def views(totals: Any) -> tuple[Any, Any]:
        inventory = {r["key"]: dict(r["on_hand"]) for r in transforms.inventory(totals).collect()}
        sales = {
            r["key"]: (r["units"], r["revenue"])
            for r in transforms.sales_by_category(totals).collect()
        }
        return inventory, sales

    assert views(merged) == views(whole)
    inventory, sales = views(merged)
    sold = sum(n % 3 + 1 for n in range(6))
    assert inventory == {"s1": {"a": -sold - 2 * len(escaped), "b": 9}}
    assert sales == {
        f"dairy@{T0}": (sold, sold * 1.5),
        f"dairy@{T0 + HOUR}": (2 * len(escaped), 2 * len(escaped) * 1.5),
    }


ASCII_LINES = [
    "".join(chr(c) for c in range(128)),
    "Don't PANIC: user_42 restocked 12 items at 09:30!!",
    "\x00a\x7fB\tc\nd\re\x1bf__G  h-i.j,k;l",
    "_ __ ___",
    "",
    "   ",
]


def _product_json(**fields: Any) -> bytes:
    return orjson.dumps({"sku": "a", "name": "Apple", "category": "fruit", **fields})


#: (description, key, value): catalogue records in and out of the plain form, valid and not.
PRODUCT_RECORDS: list[tuple[str, bytes | None, bytes | None]] = [
    ("plain", b"a", _product_json()),
    ("non-ASCII text", "é".encode(), _product_json(sku="é", name="Crème brûlée", category="é")),
    ("empty name", b"a", _product_json(name="")),
    ("256-character category", b"a", _product_json(category="é" * 256)),
    ("257-character category", b"a", _product_json(category="é" * 257)),
    ("empty category", b"a", _product_json(category="")),
    ("1025-character name", b"a", _product_json(name="n" * 1025)),
    ("ignored fields", b"a", _product_json(price=2.5, stock=3, new=True, old=None, tag="x")),
    ("ignored huge number", b"a", _product_json()[:-1] + b',"big":1e400}'),
    ("ignored long integer", b"a", _product_json()[:-1] + b',"big":12345678901234567890}'),
    ("ignored nested", b"a", _product_json(extra={"x": [1]})),
    ("escaped text", b"a", b'{"sku":"a","name":"A\\u0070ple","category":"fruit"}'),
    ("escaped name of a field", b"a", b'{"sku":"a","n\\u0061me":"A","category":"fruit"}'),
    ("duplicate, last wins", b"a", b'{"sku":"a","name":"A","category":"x","category":"veg"}'),
    ("spaces", b"a", b' { "sku" : "a" ,\n "name":"A", "category" :"fruit" } '),
    ("name of another type", b"a", b'{"sku":"a","name":7,"category":"fruit"}'),
    ("missing name", b"a", b'{"sku":"a","category":"fruit"}'),
    ("key mismatch", b"b", _product_json()),
    ("no key", None, _product_json()),
    ("tombstone", b"a", None),
    ("tombstone without a key", None, None),
    ("invalid UTF-8", b"a", b'{"sku":"a","name":"\xff","category":"fruit"}'),
    ("control character", b"a", b'{"sku":"a","name":"A\x01","category":"fruit"}'),
    ("over the size limit", b"a", _product_json(name="n" * 300)),
    ("empty object", b"a", b"{}"),
    ("not JSON", b"a", b"apple"),
]
PRODUCT_MAX_BYTES = 1200


def test_catalogue_versions_equal_the_stream_validation_in_and_out_of_the_plain_form(
    spark: Any,
) -> None:
    frame = kafka_rows(spark, [(k, v, n, T0 + n) for n, (_, k, v) in enumerate(PRODUCT_RECORDS)])
    python = transforms.product_versions(frame, PRODUCT_MAX_BYTES)
    first = transforms.plain_product_versions(frame, PRODUCT_MAX_BYTES)
    assert first is not None
    plain = first.where("plain").drop("plain")
    jvm = plain.unionByName(transforms.other_product_versions(frame, PRODUCT_MAX_BYTES))

    def versions(frame: Any) -> list[tuple[Any, ...]]:
        return sorted(tuple(r) for r in frame.collect())

    assert versions(jvm) == versions(python)
    outside = {r["offset"] for r in first.where("not plain").collect()}
    named = {description: n for n, (description, _, _) in enumerate(PRODUCT_RECORDS)}
    for description in ("escaped text", "ignored nested", "name of another type", "not JSON"):
        assert named[description] in outside, description
    for description in ("plain", "non-ASCII text", "ignored fields", "257-character category"):
        assert named[description] not in outside, description
    kept = {r["offset"]: r["category"] for r in python.collect()}
    assert kept[named["duplicate, last wins"]] == "veg"
    assert kept[named["tombstone"]] is None
    assert named["257-character category"] not in kept


def test_lines_give_the_stream_tokens_and_counts_with_and_without_the_jdk(spark: Any) -> None:
    assert transforms.java_tokeniser(spark.range(1))
    lines = ASCII_LINES + LINES
    values = [line.encode() for line in lines] + [None, b"caf\xc3", b"long " * 20_000]
    stream = sorted(t for line in lines for t in semantics.tokenize(line))
    counts = {w: stream.count(w) for w in stream}

    def batch() -> tuple[list[str], dict[str, int]]:
        frame = lines_frame(spark, values)
        words = sorted(r["word"] for r in transforms.words(frame).collect())
        return words, {r["key"]: r["count"] for r in transforms.word_counts(frame).collect()}

    assert batch() == (stream, counts)
    spark.sql(f"DROP TEMPORARY FUNCTION {transforms.WORDS_UDF}")
    try:
        assert not transforms.java_tokeniser(spark.range(1))
        assert batch() == (stream, counts)
    finally:
        assert session.register_udfs(spark)
