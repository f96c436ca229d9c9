"""The recompute as pure DataFrame -> DataFrame functions, with the stream's semantics.

Input frames have the Kafka source's columns (``key``, ``value``, ``partition``,
``offset``, ``timestamp``). Every rule that the stream applies per record comes from
``app.semantics``: lines that are pure ASCII are tokenised natively (lower-case, split on
``[^a-zA-Z0-9_]+``, which is Python's ``\\W+`` restricted to ASCII), all other lines and
every JSON record go through Arrow UDFs that call the same functions as the workers.
"""

from __future__ import annotations

from typing import Any

import pandas as pd  # type: ignore[import-untyped]
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as sf
from pyspark.sql.pandas import functions as pandas_functions

from app import semantics

# pyspark's overloads of pandas_udf cannot type a UDF over untyped pandas (no stubs here).
pandas_udf: Any = pandas_functions.pandas_udf

#: Window-key separator of sales_by_category keys: ``<category>@<window start ms>``.
WINDOW_KEY_SEP = "@"

ITEM_EVENT_SCHEMA = (
    "ok boolean, event_id string, store_id string, sku string, kind string, "
    "quantity long, unit_price double, ts long"
)
PRODUCT_SCHEMA = "ok boolean, category string"


# -- word_counts ---------------------------------------------------------------------


def _tokens_udf(max_bytes: int) -> Any:
    def tokens(values: pd.Series) -> pd.Series:
        out: list[list[str]] = []
        for raw in values:
            if raw is None:  # an ASCII line, split in the JVM
                out.append([])
                continue
            try:
                line = semantics.decode_text_line(raw, max_bytes)
            except semantics.InvalidEvent:
                out.append([])
                continue
            out.append(semantics.tokenize(line))
        return pd.Series(out)

    return pandas_udf(tokens, "array<string>")


def words(lines: DataFrame, max_bytes: int = semantics.DEFAULT_MAX_BYTES) -> DataFrame:
    """One row per token of every valid text line: ``word``.

    One pass over the lines: ASCII lines are split in the JVM and reach the Python UDF
    as nulls (cheap to skip), so the topic is read once.
    """
    text = sf.col("value").cast("string")
    sized = lines.where(sf.col("value").isNotNull() & (sf.octet_length("value") <= max_bytes))
    # Invalid UTF-8 becomes U+FFFD in Java's String, so it never looks like ASCII here.
    is_ascii = ~text.rlike("[^\\x00-\\x7F]")
    native = sf.split(sf.lower(text), "[^a-zA-Z0-9_]+")
    python = _tokens_udf(max_bytes)(sf.when(~is_ascii, sf.col("value")))
    tokens = sf.when(is_ascii, native).otherwise(python)
    return sized.select(sf.explode(tokens).alias("word")).where(sf.col("word") != "")


def word_counts(lines: DataFrame, max_bytes: int = semantics.DEFAULT_MAX_BYTES) -> DataFrame:
    """The batch view of word_counts: ``key`` (the word), ``count``."""
    return (
        words(lines, max_bytes)
        .groupBy(sf.col("word").alias("key"))
        .agg(sf.count("*").alias("count"))
    )


# -- item events ---------------------------------------------------------------------


def _item_events_udf(max_bytes: int) -> Any:
    def parse(keys: pd.Series, values: pd.Series) -> pd.DataFrame:
        rows: list[tuple[Any, ...]] = []
        for key, raw in zip(keys, values, strict=True):
            try:
                event = semantics.parse_item_event(raw, max_bytes)
                semantics.check_key(key, event.store_id, "store_id")
            except semantics.InvalidEvent:
                rows.append((False, None, None, None, None, None, None, None))
                continue
            rows.append(
                (
                    True,
                    event.event_id,
                    event.store_id,
                    event.sku,
                    event.kind,
                    event.quantity,
                    event.unit_price,
                    event.ts,
                )
            )
        return pd.DataFrame(rows, columns=[c.split()[0] for c in ITEM_EVENT_SCHEMA.split(", ")])

    return pandas_udf(parse, ITEM_EVENT_SCHEMA)


def item_events(records: DataFrame, max_bytes: int = semantics.DEFAULT_MAX_BYTES) -> DataFrame:
    """Valid item events (invalid ones are the stream's DLQ): the event's fields."""
    parsed = records.select(_item_events_udf(max_bytes)(sf.col("key"), sf.col("value")).alias("e"))
    return parsed.where(sf.col("e.ok")).select("e.*").drop("ok")


def inventory(events: DataFrame) -> DataFrame:
    """The batch view of inventory: ``key``, ``store_id``, ``on_hand`` (map), ``updated_at``."""
    delta = sf.when(sf.col("kind") == "sale", -sf.col("quantity")).otherwise(sf.col("quantity"))
    per_sku = events.groupBy("store_id", "sku").agg(
        sf.sum(delta).alias("on_hand"), sf.max("ts").alias("updated_at")
    )
    return (
        per_sku.groupBy("store_id")
        .agg(
            sf.map_from_entries(sf.collect_list(sf.struct("sku", "on_hand"))).alias("on_hand"),
            sf.max("updated_at").alias("updated_at"),
        )
        .select(sf.col("store_id").alias("key"), "store_id", "on_hand", "updated_at")
    )


# -- sales_by_category ---------------------------------------------------------------


def _products_udf(max_bytes: int) -> Any:
    def parse(keys: pd.Series, values: pd.Series) -> pd.DataFrame:
        rows: list[tuple[bool, str | None]] = []
        for key, raw in zip(keys, values, strict=True):
            if key is None:
                rows.append((False, None))
            elif raw is None:
                rows.append((True, None))  # a tombstone deletes the product
            else:
                try:
                    product = semantics.parse_product(raw, max_bytes)
                    semantics.check_key(key, product.sku, "sku")
                except semantics.InvalidEvent:
                    rows.append((False, None))
                    continue
                rows.append((True, product.category))
        return pd.DataFrame(rows, columns=["ok", "category"])

    return pandas_udf(parse, PRODUCT_SCHEMA)


def product_versions(records: DataFrame, max_bytes: int = semantics.DEFAULT_MAX_BYTES) -> DataFrame:
    """Catalogue versions: ``sku``, ``at`` (record timestamp, ms), ``offset``, ``category``
    (null for a deletion). Invalid records are skipped, as the workers' catalogue does."""
    parsed = records.select(
        sf.col("key").cast("string").alias("sku"),
        sf.unix_millis("timestamp").alias("at"),
        "offset",
        _products_udf(max_bytes)(sf.col("key"), sf.col("value")).alias("p"),
    )
    return parsed.where(sf.col("p.ok")).select("sku", "at", "offset", sf.col("p.category"))


def enrich_sales(events: DataFrame, versions: DataFrame) -> DataFrame:
    """Sales with the category of their product's latest version at or before ``ts``.

    Versions and sales of one SKU are ordered by time, a version before a sale of the same
    millisecond (``timestamp <= ts``) and versions of one millisecond by offset; each sale
    takes the last version before it ("unknown" when none, or when it is a deletion).
    """
    sales = events.where(sf.col("kind") == "sale").select(
        "sku",
        sf.col("ts").alias("at"),
        sf.lit(1).alias("order"),
        sf.lit(None).cast("long").alias("offset"),
        sf.lit(None).cast("struct<category:string>").alias("version"),
        sf.col("quantity").alias("units"),
        (sf.col("quantity").cast("double") * sf.col("unit_price")).alias("revenue"),
    )
    catalogue = versions.select(
        "sku",
        "at",
        sf.lit(0).alias("order"),
        "offset",
        sf.struct("category").alias("version"),
        sf.lit(None).cast("long").alias("units"),
        sf.lit(None).cast("double").alias("revenue"),
    )
    timeline = (
        Window.partitionBy("sku")
        .orderBy("at", "order", "offset")
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )
    known = sf.last("version", ignorenulls=True).over(timeline)
    merged = sales.unionByName(catalogue).withColumn("known", known)
    return merged.where(sf.col("order") == 1).select(
        sf.coalesce(sf.col("known.category"), sf.lit(semantics.UNKNOWN_CATEGORY)).alias("category"),
        sf.col("at").alias("ts"),
        "units",
        "revenue",
    )


def window_key(category: Column, start_ms: Column) -> Column:
    return sf.concat(category, sf.lit(WINDOW_KEY_SEP), start_ms.cast("string"))


def sales_by_category(sales: DataFrame) -> DataFrame:
    """The batch view of sales_by_category: ``key``, ``category``, ``window_start`` (ms),
    ``units``, ``revenue``, one row per category and tumbling hour."""
    start = sf.col("ts") - sf.col("ts") % sf.lit(semantics.HOUR_MS)
    totals = sales.groupBy("category", start.alias("window_start")).agg(
        sf.sum("units").alias("units"), sf.sum("revenue").alias("revenue")
    )
    return totals.select(
        window_key(sf.col("category"), sf.col("window_start")).alias("key"),
        "category",
        "window_start",
        "units",
        "revenue",
    )


# -- the live tables, from their changelogs ------------------------------------------


def latest(changelog: DataFrame) -> DataFrame:
    """Latest value per key of a changelog (``key``, ``value`` as strings); tombstones
    remove the key."""
    newest = changelog.groupBy("key").agg(
        sf.max_by(sf.struct("value"), sf.col("offset")).alias("last")
    )
    return newest.where(sf.col("last.value").isNotNull()).select(
        sf.col("key").cast("string").alias("key"),
        sf.col("last.value").cast("string").alias("raw"),
    )


def stream_word_counts(changelog: DataFrame) -> DataFrame:
    """word_counts as the workers hold it: ``key``, ``count``, ``raw``."""
    return latest(changelog).select("key", sf.col("raw").cast("long").alias("count"), "raw")


def stream_inventory(changelog: DataFrame) -> DataFrame:
    """inventory as the workers hold it: ``key``, ``store_id``, ``on_hand``, ``updated_at``."""
    schema = "store_id string, on_hand map<string,long>, updated_at long"
    value = sf.from_json("raw", schema)
    return latest(changelog).select(
        "key",
        value.store_id.alias("store_id"),
        value.on_hand.alias("on_hand"),
        value.updated_at.alias("updated_at"),
        "raw",
    )


def stream_sales_by_category(changelog: DataFrame) -> DataFrame:
    """sales_by_category as the workers hold it; JSON keys ``[category, [start_s, end_s]]``
    become ``category@start_ms``."""
    rows = latest(changelog)
    category = sf.get_json_object("key", "$[0]")
    start_ms = sf.round(sf.get_json_object("key", "$[1][0]").cast("double") * 1000).cast("long")
    value = sf.from_json("raw", "units long, revenue double")
    return rows.select(
        window_key(category, start_ms).alias("key"),
        category.alias("category"),
        start_ms.alias("window_start"),
        value.units.alias("units"),
        value.revenue.alias("revenue"),
        "raw",
    )


def live_windows(view: DataFrame, horizon_ms: int) -> DataFrame:
    """Windows that the stream has not expired (start at or after ``horizon_ms``)."""
    return view.where(sf.col("window_start") >= sf.lit(horizon_ms))


def expired_horizon(now_ms: int, retention_ms: int) -> int:
    """Start of the oldest window both sides are sure to hold at ``now_ms``.

    faust drops a window once its end is before the start of the window that holds
    ``now - retention`` (wall-clock time, checked every 30 s); the window after that
    one is safe for the length of a job run.
    """
    return semantics.window_start(now_ms - retention_ms) + semantics.HOUR_MS
