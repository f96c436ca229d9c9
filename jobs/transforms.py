"""The recompute as pure DataFrame -> DataFrame functions, with the stream's semantics.

Input frames have the Kafka source's columns (``key``, ``value``, ``partition``,
``offset``, ``timestamp``). Every rule that the stream applies per record comes from
``core.semantics``. Most records never reach Python: text lines are tokenised and
counted in the JVM with Python's own character tables (``jobs/pytext.py``); item events
and catalogue records in the plain JSON form (a flat object of the schema's fields,
strings without escapes) are parsed and validated in the JVM by rules that restate the
schema's, and the events are summed there as they are read. Every other record goes
through Arrow UDFs that call the same functions as the workers, so a record outside the
plain form is judged by the stream's own code. Without the JDK, every record is judged
in Python (ASCII lines are split by Spark SQL).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]
from py4j.java_gateway import JavaClass  # type: ignore[import-untyped]
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as sf
from pyspark.sql.pandas import functions as pandas_functions

from core import semantics
from jobs.session import JAVA_UDFS

_arrow_udf: Any = pandas_functions.arrow_udf


def arrow_udf(function: Any, return_type: str) -> Any:
    """A UDF over Arrow arrays that runs once per row. Marked nondeterministic so that the
    optimizer does not copy it into a filter on its result, which would run it twice."""
    return _arrow_udf(function, return_type).asNondeterministic()


def _arrow_struct(schema: str) -> Any:
    """The Arrow struct type of a DDL schema of flat fields (``name type, ...``)."""
    types = {
        "boolean": pa.bool_(),
        "string": pa.string(),
        "long": pa.int64(),
        "double": pa.float64(),
    }
    return pa.struct(
        [pa.field(name, types[kind]) for name, kind in (f.split() for f in schema.split(", "))]
    )


def _struct(arrow_type: Any, columns: dict[str, list[Any]]) -> Any:
    return pa.StructArray.from_arrays(
        [pa.array(columns[field.name], type=field.type) for field in arrow_type],
        fields=list(arrow_type),
    )


#: Window-key separator of sales_by_category keys: ``<category>@<window start ms>``.
WINDOW_KEY_SEP = "@"

ITEM_EVENT_SCHEMA = (
    "ok boolean, event_id string, store_id string, sku string, kind string, "
    "quantity long, unit_price double, ts long"
)
PRODUCT_SCHEMA = "ok boolean, category string"
_ITEM_EVENT_FIELDS = [c.split()[0] for c in ITEM_EVENT_SCHEMA.split(", ")]


# -- word_counts ---------------------------------------------------------------------


def _tokens_udf(max_bytes: int) -> Any:
    list_type = pa.list_(pa.string())

    def tokens(values: pa.Array) -> pa.Array:
        if values.null_count == len(values):  # a batch of ASCII lines, split by Spark SQL
            return pa.nulls(len(values), list_type)
        out: list[list[str] | None] = []
        for raw in values.to_pylist():
            if raw is None:  # an ASCII line
                out.append(None)
                continue
            try:
                line = semantics.decode_text_line(raw, max_bytes)
            except semantics.InvalidEvent:
                out.append(None)
                continue
            out.append(semantics.tokenize(line))
        return pa.array(out, type=list_type)

    return arrow_udf(tokens, "array<string>")


#: The Java UDF that tokenises a line as the stream does (jobs/java, jobs/session.py).
WORDS_UDF = "streamstate_words"
#: The ASCII characters that are not word characters (``[^a-zA-Z0-9_]``): Python's
#: ``\W`` on an ASCII line.
ASCII_NON_WORD = "".join(chr(c) for c in range(128) if not (chr(c).isalnum() or chr(c) == "_"))


def java_tokeniser(lines: DataFrame) -> bool:
    """Whether the Java tokeniser is on the session's classpath (and registered)."""
    return bool(lines.sparkSession.catalog.functionExists(WORDS_UDF))


def _ascii_words(lines: DataFrame) -> Column:
    """Without the JDK: per line, its tokens when it is pure ASCII (null otherwise), by
    Spark SQL functions."""
    text = sf.col("value").cast("string")
    # Invalid UTF-8 becomes U+FFFD in Java's String, so it never looks like ASCII here.
    is_ascii = ~text.rlike("[^\\x00-\\x7F]")
    spaced = sf.translate(sf.lower(text), ASCII_NON_WORD, " " * len(ASCII_NON_WORD))
    return sf.when(is_ascii, sf.filter(sf.split(spaced, " "), lambda w: w != ""))


def _tokens(sized: DataFrame, max_bytes: int) -> Column:
    """The tokens of each line (null for an invalid one): the Java tokeniser, or without it
    Spark SQL for the ASCII lines and the stream's Python function for the others."""
    if java_tokeniser(sized):
        return sf.call_function(WORDS_UDF, sf.col("value"))
    ascii_tokens = _ascii_words(sized)
    python = _tokens_udf(max_bytes)(sf.when(ascii_tokens.isNull(), sf.col("value")))
    return sf.coalesce(ascii_tokens, python)


def words(lines: DataFrame, max_bytes: int = semantics.DEFAULT_MAX_BYTES) -> DataFrame:
    """One row per token of every valid text line: ``word``."""
    sized = lines.where(sf.col("value").isNotNull() & (sf.octet_length("value") <= max_bytes))
    return sized.select(sf.explode(_tokens(sized, max_bytes)).alias("word"))


def java_class(spark: Any, name: str) -> Any:
    """The job's Java class ``streamstate.jobs.<name>`` through py4j, or None when the
    driver cannot load it (a jar added to the session after it started, under spark-submit
    without ``--jars``)."""
    found = getattr(spark._jvm.streamstate.jobs, name)
    return found if isinstance(found, JavaClass) else None


def _partial_word_counts(lines: DataFrame, max_bytes: int) -> DataFrame | None:
    """``key``, ``count`` per word and Spark partition, counted in the JVM as the lines are
    read (no row per token); None without the Java classes."""
    spark = lines.sparkSession
    counter = java_class(spark, "WordCounts") if java_tokeniser(lines) else None
    if counter is None:
        return None
    return DataFrame(counter.partial(lines._jdf, max_bytes), spark)


def word_counts(lines: DataFrame, max_bytes: int = semantics.DEFAULT_MAX_BYTES) -> DataFrame:
    """The batch view of word_counts: ``key`` (the word), ``count``."""
    partial = _partial_word_counts(lines, max_bytes)
    if partial is not None:
        return partial.groupBy("key").agg(sf.sum("count").alias("count"))
    return (
        words(lines, max_bytes)
        .groupBy(sf.col("word").alias("key"))
        .agg(sf.count("*").alias("count"))
    )


# -- item events ---------------------------------------------------------------------


def _item_events_udf(max_bytes: int) -> Any:
    arrow_type = _arrow_struct(ITEM_EVENT_SCHEMA)

    def parse(keys: pa.Array, values: pa.Array) -> pa.Array:
        columns: dict[str, list[Any]] = {name: [None] * len(values) for name in _ITEM_EVENT_FIELDS}
        for i, (key, raw) in enumerate(zip(keys.to_pylist(), values.to_pylist(), strict=True)):
            try:
                event = semantics.parse_item_event(raw, max_bytes)
                semantics.check_key(key, event.store_id, "store_id")
            except semantics.InvalidEvent:
                columns["ok"][i] = False
                continue
            columns["ok"][i] = True
            for name in _ITEM_EVENT_FIELDS[1:]:
                columns[name][i] = getattr(event, name)
        return _struct(arrow_type, columns)

    return arrow_udf(parse, ITEM_EVENT_SCHEMA)


#: The Java UDF that parses item events in the plain form (jobs/java, jobs/session.py).
PLAIN_ITEM_EVENT_UDF = "streamstate_plain_item_event"
_PLAIN_TYPE = JAVA_UDFS[PLAIN_ITEM_EVENT_UDF][1]


def plain_form_parser(records: DataFrame) -> bool:
    """Whether the Java UDF that parses the plain form is registered."""
    return bool(records.sparkSession.catalog.functionExists(PLAIN_ITEM_EVENT_UDF))


def plain_item_events(records: DataFrame, max_bytes: int) -> Column:
    """Per record, the Java parse of an item event in the plain form: ``ok`` and the fields,
    null for a record outside that form (or for all when the UDF is not registered)."""
    if not plain_form_parser(records):
        return sf.lit(None).cast(_PLAIN_TYPE)
    return sf.call_function(PLAIN_ITEM_EVENT_UDF, sf.col("key"), sf.col("value"), sf.lit(max_bytes))


def plain_events(records: DataFrame, max_bytes: int = semantics.DEFAULT_MAX_BYTES) -> DataFrame:
    """The first pass over item events, in the JVM alone: the fields of the valid events in
    the plain form; for each record outside it a row with ``pending`` 1 (left for
    :func:`other_events`). Invalid events and pending rows have null fields, which every
    aggregation of :func:`store_totals` leaves out."""
    parsed = records.select(plain_item_events(records, max_bytes).alias("p"))
    return parsed.select(
        *[sf.col("p")[f].alias(f) for f in _ITEM_EVENT_FIELDS[1:]],
        sf.col("p").isNull().cast("long").alias("pending"),
    )


def other_events(records: DataFrame, max_bytes: int = semantics.DEFAULT_MAX_BYTES) -> DataFrame:
    """The second pass: the records outside the plain form, judged by the stream's own
    validation in Python; the valid events, with ``pending`` 0."""
    outside = records.where(plain_item_events(records, max_bytes).isNull())
    parsed = outside.select(_item_events_udf(max_bytes)(sf.col("key"), sf.col("value")).alias("e"))
    return parsed.where(sf.col("e.ok")).select(
        *[sf.col("e")[f].alias(f) for f in _ITEM_EVENT_FIELDS[1:]],
        sf.lit(0).cast("long").alias("pending"),
    )


def item_events(records: DataFrame, max_bytes: int = semantics.DEFAULT_MAX_BYTES) -> DataFrame:
    """Valid item events (invalid ones are the stream's DLQ): the event's fields and
    ``pending`` 0. Both passes; the job runs the second only when the first left records."""
    plain = plain_events(records, max_bytes).where(
        (sf.col("pending") == 0) & sf.col("event_id").isNotNull()
    )
    return plain.unionByName(other_events(records, max_bytes))


# -- inventory and sales_by_category -----------------------------------------------


def _products_udf(max_bytes: int) -> Any:
    arrow_type = _arrow_struct(PRODUCT_SCHEMA)

    def parse(keys: pa.Array, values: pa.Array) -> pa.Array:
        columns: dict[str, list[Any]] = {"ok": [], "category": []}
        for key, raw in zip(keys.to_pylist(), values.to_pylist(), strict=True):
            ok, category = True, None  # a tombstone (null value) deletes the product
            if key is None:
                ok = False
            elif raw is not None:
                try:
                    product = semantics.parse_product(raw, max_bytes)
                    semantics.check_key(key, product.sku, "sku")
                    category = product.category
                except semantics.InvalidEvent:
                    ok = False
            columns["ok"].append(ok)
            columns["category"].append(category)
        return _struct(arrow_type, columns)

    return arrow_udf(parse, PRODUCT_SCHEMA)


def product_versions(records: DataFrame, max_bytes: int = semantics.DEFAULT_MAX_BYTES) -> DataFrame:
    """Catalogue versions: ``sku``, ``at`` (record timestamp, ms), ``offset``, ``category``
    (null for a deletion). Invalid records are skipped, as the workers' catalogue does.
    Every record is judged in Python (see :func:`plain_product_versions`)."""
    parsed = records.select(
        sf.col("key").cast("string").alias("sku"),
        sf.unix_millis("timestamp").alias("at"),
        "offset",
        _products_udf(max_bytes)(sf.col("key"), sf.col("value")).alias("p"),
    )
    return parsed.where(sf.col("p.ok")).select("sku", "at", "offset", sf.col("p.category"))


#: The Java UDF that parses catalogue records in the plain form (jobs/java, jobs/session.py).
PLAIN_PRODUCT_UDF = "streamstate_plain_product"


def _plain_product(records: DataFrame, max_bytes: int) -> Column:
    return sf.call_function(PLAIN_PRODUCT_UDF, sf.col("key"), sf.col("value"), sf.lit(max_bytes))


def plain_product_versions(
    records: DataFrame, max_bytes: int = semantics.DEFAULT_MAX_BYTES
) -> DataFrame | None:
    """The first pass over the catalogue, in the JVM alone: the versions of the records in
    the plain form, with ``plain`` true, and a row with ``plain`` false (and null fields)
    for each record outside it, left for :func:`other_product_versions`. None without the
    Java UDF."""
    if not records.sparkSession.catalog.functionExists(PLAIN_PRODUCT_UDF):
        return None
    parsed = records.select(
        sf.col("key").cast("string").alias("sku"),
        sf.unix_millis("timestamp").alias("at"),
        "offset",
        _plain_product(records, max_bytes).alias("p"),
    )
    plain = sf.col("p").isNotNull()
    return parsed.where(~plain | sf.col("p.ok")).select(
        sf.when(plain, sf.col("sku")).alias("sku"),
        "at",
        "offset",
        sf.col("p.category").alias("category"),
        plain.alias("plain"),
    )


def other_product_versions(
    records: DataFrame, max_bytes: int = semantics.DEFAULT_MAX_BYTES
) -> DataFrame:
    """The second pass: the versions of the records outside the plain form, judged by the
    stream's own validation in Python."""
    return product_versions(records.where(_plain_product(records, max_bytes).isNull()), max_bytes)


#: ``until`` of a catalogue version that nothing replaced.
_FOREVER_MS = 2**63 - 1


def catalogue_spans(versions: DataFrame) -> DataFrame:
    """The time each catalogue version holds for its SKU: ``sku``, ``since`` (inclusive),
    ``until`` (exclusive, the next version's ``at``), ``category`` (null: deleted).

    Versions of one SKU follow each other by time, and by offset within a millisecond;
    of several versions of one millisecond only the last holds any time.
    """
    order = Window.partitionBy("sku").orderBy("at", "offset")
    return versions.select(
        "sku",
        sf.col("at").alias("since"),
        sf.coalesce(sf.lead("at").over(order), sf.lit(_FOREVER_MS)).alias("until"),
        "category",
    )


def with_categories(events: DataFrame, versions: DataFrame) -> DataFrame:
    """The events, each sale with ``category``: that of its product's version at ``ts``
    (a version counts from its own millisecond on), "unknown" when there is none or it is
    a deletion; null for the other events.

    A join on the SKU and the version's time span, not a sort of the sales: a sale finds
    at most one span, since a SKU's spans do not overlap. The catalogue is small: when
    Spark knows its size (``versions`` cached and materialized, as the job does) the join
    is a broadcast and the events are not shuffled.
    """
    sale = sf.col("e.kind") == "sale"
    spans = catalogue_spans(versions).alias("v")
    ts = sf.col("e.ts")
    on = (
        sale
        & (sf.col("e.sku") == sf.col("v.sku"))
        & (sf.col("v.since") <= ts)
        & (ts < sf.col("v.until"))
    )
    category = sf.coalesce(sf.col("v.category"), sf.lit(semantics.UNKNOWN_CATEGORY))
    return (
        events.alias("e")
        .join(spans, on, "left")
        .select("e.*", sf.when(sale, category).alias("category"))
    )


def store_totals(events: DataFrame, versions: DataFrame) -> DataFrame:
    """inventory and sales_by_category in one aggregation of the events (grouping sets),
    so that the events are read and parsed once for both:

    - rows with ``store_id``, ``sku``: ``on_hand`` (sum of stock deltas), ``updated_at``
    - rows with ``category``, ``window_start``: ``units``, ``revenue`` of the sales
    """
    frame = with_categories(events, versions)
    sale = sf.col("kind") == "sale"
    delta = sf.when(sale, -sf.col("quantity")).otherwise(sf.col("quantity"))
    start = sf.col("ts") - sf.col("ts") % sf.lit(semantics.HOUR_MS)
    rows = frame.select(
        "store_id",
        "sku",
        "category",
        sf.when(sale, start).alias("window_start"),
        delta.alias("delta"),
        "ts",
        sf.when(sale, sf.col("quantity")).alias("units"),
        sf.when(sale, sf.col("quantity").cast("double") * sf.col("unit_price")).alias("revenue"),
        "pending",
    )
    return rows.groupingSets(
        [["store_id", "sku"], ["category", "window_start"]],
        "store_id",
        "sku",
        "category",
        "window_start",
    ).agg(
        sf.sum("delta").alias("on_hand"),
        sf.max("ts").alias("updated_at"),
        sf.sum("units").alias("units"),
        sf.sum("revenue").alias("revenue"),
        sf.sum("pending").alias("pending"),
        sf.grouping("store_id").alias("by_category"),
    )


_TOTALS_KEYS = ("store_id", "sku", "category", "window_start", "by_category")


def pending_records(totals: DataFrame) -> int:
    """How many records the first pass left for the second (see :func:`plain_events`)."""
    rows = totals.where((sf.col("by_category") == 0) & sf.col("store_id").isNull())
    [[count]] = rows.agg(sf.sum("pending")).collect()
    return int(count or 0)


def sum_totals(frame: DataFrame) -> DataFrame:
    """Totals added up by their keys (sums, and the latest ``updated_at``)."""
    return frame.groupBy(*_TOTALS_KEYS).agg(
        sf.sum("on_hand").alias("on_hand"),
        sf.max("updated_at").alias("updated_at"),
        sf.sum("units").alias("units"),
        sf.sum("revenue").alias("revenue"),
        sf.sum("pending").alias("pending"),
    )


def plain_store_totals(
    events: DataFrame, versions: DataFrame, max_bytes: int = semantics.DEFAULT_MAX_BYTES
) -> DataFrame | None:
    """:func:`store_totals` of the events in the plain form, summed in the JVM as they are
    read (``jobs/java/.../StoreTotals.java``: one map per partition, no row per event; the
    catalogue's spans are broadcast); the records outside the plain form are counted in
    ``pending`` for the second pass. None without the Java classes."""
    spark = events.sparkSession
    summer = java_class(spark, "StoreTotals") if plain_form_parser(events) else None
    if summer is None:
        return None
    spans = catalogue_spans(versions)
    partial = summer.partial(
        events._jdf, max_bytes, spans._jdf, semantics.UNKNOWN_CATEGORY, semantics.HOUR_MS
    )
    return sum_totals(DataFrame(partial, spark))


def merge_totals(first: DataFrame, second: DataFrame) -> DataFrame:
    """The totals of both passes over the events (sums and maxima combine)."""
    merged = sum_totals(first.unionByName(second))
    return merged.withColumn("pending", sf.lit(0).cast("long"))


def inventory(totals: DataFrame) -> DataFrame:
    """The batch view of inventory: ``key``, ``store_id``, ``on_hand`` (map), ``updated_at``."""
    per_sku = totals.where((sf.col("by_category") == 0) & sf.col("store_id").isNotNull())
    return (
        per_sku.groupBy("store_id")
        .agg(
            sf.map_from_entries(sf.collect_list(sf.struct("sku", "on_hand"))).alias("on_hand"),
            sf.max("updated_at").alias("updated_at"),
        )
        .select(sf.col("store_id").alias("key"), "store_id", "on_hand", "updated_at")
    )


def window_key(category: Column, start_ms: Column) -> Column:
    return sf.concat(category, sf.lit(WINDOW_KEY_SEP), start_ms.cast("string"))


def sales_by_category(totals: DataFrame) -> DataFrame:
    """The batch view of sales_by_category: ``key``, ``category``, ``window_start`` (ms),
    ``units``, ``revenue``, one row per category and tumbling hour."""
    windows = totals.where((sf.col("by_category") == 1) & sf.col("category").isNotNull())
    return windows.select(
        window_key(sf.col("category"), sf.col("window_start")).alias("key"),
        "category",
        "window_start",
        "units",
        "revenue",
    )


# -- the live tables, from their changelogs ------------------------------------------


def latest(changelog: DataFrame) -> DataFrame:
    """Latest value per key of a changelog (``key``, ``raw`` as strings); tombstones
    remove the key."""
    return latest_by_topic(changelog).drop("topic")


def latest_by_topic(changelogs: DataFrame) -> DataFrame:
    """Latest value per key of each changelog in one frame (``topic``, ``key``, ``raw``
    as strings), in one aggregation; tombstones remove the key, and the workers' record
    of their source offsets (:data:`core.topics.POSITION_KEY`) is no table key."""
    # Imported here, on the driver: the executors import this module for its UDFs, and
    # the engine (with its dependencies) is not shipped to them.
    from core.topics import POSITION_KEY

    keys = changelogs.where(sf.col("key") != sf.lit(bytearray(POSITION_KEY)))
    newest = keys.groupBy("topic", "key").agg(
        sf.max_by(sf.struct("value"), sf.col("offset")).alias("last")
    )
    return newest.where(sf.col("last.value").isNotNull()).select(
        "topic",
        sf.col("key").cast("string").alias("key"),
        sf.col("last.value").cast("string").alias("raw"),
    )


def stream_word_counts(changelog: DataFrame) -> DataFrame:
    """word_counts as the workers hold it: ``key``, ``count``, ``raw``."""
    return live_word_counts(latest(changelog))


def live_word_counts(rows: DataFrame) -> DataFrame:
    """word_counts from the latest rows of its changelog (:func:`latest`)."""
    return rows.select("key", sf.col("raw").cast("long").alias("count"), "raw")


def stream_inventory(changelog: DataFrame) -> DataFrame:
    """inventory as the workers hold it: ``key``, ``store_id``, ``on_hand``, ``updated_at``."""
    return live_inventory(latest(changelog))


def live_inventory(rows: DataFrame) -> DataFrame:
    """inventory from the latest rows of its changelog (:func:`latest`)."""
    schema = "store_id string, on_hand map<string,long>, updated_at long"
    value = sf.from_json("raw", schema)
    return rows.select(
        "key",
        value.store_id.alias("store_id"),
        value.on_hand.alias("on_hand"),
        value.updated_at.alias("updated_at"),
        "raw",
    )


def stream_sales_by_category(changelog: DataFrame) -> DataFrame:
    """sales_by_category as the workers hold it; JSON keys ``[category, [start_s, end_s]]``
    become ``category@start_ms``."""
    return live_sales_by_category(latest(changelog))


def live_sales_by_category(rows: DataFrame) -> DataFrame:
    """sales_by_category from the latest rows of its changelog (:func:`latest`)."""
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
