"""Reconciliation: each recomputed table against the live one, key by key.

Both sides come as rows ``table, raw_key, key, window_start, window_end, value`` (the
value as JSON). Keys are matched by their raw key, or for a windowed table by its key
and window start. Two values are the same when they are equal as JSON, numbers within a
relative :data:`TOLERANCE` (a floating sum depends on the order of its terms, which
differs between the stream's batches and the job's); values whose JSON text is equal
are the same at once, the others are judged in Python. A window that ended before the
table's retention, measured as of the cut, is left out on both sides: the stream drops
it, at a time of its own.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any

import orjson
import pyarrow as pa
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as sf

#: Numbers are the same within this relative difference (absolute below 1).
TOLERANCE = 1e-9
EQUAL = "equal"
MISMATCHED = "mismatched"
MISSING_IN_STREAM = "missing_in_stream"
MISSING_IN_BATCH = "missing_in_batch"
DIFFERENCES = (MISMATCHED, MISSING_IN_STREAM, MISSING_IN_BATCH)
_UNSURE = "unsure"

DIFF_DDL = (
    "table string, key string, window_start bigint, batch_end bigint, stream_end bigint, "
    "batch binary, stream binary, status string"
)


def same_value(a: Any, b: Any) -> bool:
    """Equal JSON values; numbers within :data:`TOLERANCE` (relative, absolute below 1)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, int | float) and isinstance(b, int | float):
        if a == b:
            return True
        if not (math.isfinite(a) and math.isfinite(b)):
            return False
        return abs(a - b) <= TOLERANCE * max(1.0, abs(a), abs(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b, strict=True))
    return bool(type(a) is type(b) and a == b)


def same_json(a: bytes | None, b: bytes | None) -> bool:
    """Whether two stored values are the same (see :func:`same_value`); a value that is
    not JSON is the same only as identical bytes."""
    if a == b:
        return True
    if a is None or b is None:
        return False
    try:
        return same_value(orjson.loads(a), orjson.loads(b))
    except orjson.JSONDecodeError:
        return False


def is_json(raw: bytes) -> bool:
    try:
        orjson.loads(raw)
    except orjson.JSONDecodeError:
        return False
    return True


def loads(raw: bytes | None) -> Any:
    """A stored value for the report: its JSON, or its text when it is not JSON."""
    if raw is None:
        return None
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw.decode("utf-8", "replace")


def _judge(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The rows whose JSON text differs, judged equal or mismatched in Python."""
    for batch in batches:
        columns = [
            batch.column(c).to_pylist() for c in ("batch_end", "stream_end", "batch", "stream")
        ]
        status = [
            EQUAL if b_end == s_end and same_json(b, s) else MISMATCHED
            for b_end, s_end, b, s in zip(*columns, strict=True)
        ]
        index = batch.schema.get_field_index("status")
        yield batch.set_column(index, "status", pa.array(status, pa.string()))


def _kept(rows: DataFrame, horizons: Mapping[str, int]) -> DataFrame:
    """Rows without the windows that ended at or before their table's horizon."""
    if not horizons:
        return rows
    horizon: Column = sf.lit(None).cast("bigint")
    for table, ms in horizons.items():
        horizon = sf.when(sf.col("table") == table, sf.lit(ms)).otherwise(horizon)
    return rows.where(
        sf.col("window_end").isNull() | horizon.isNull() | (sf.col("window_end") > horizon)
    )


def _match(prefix: str) -> Column:
    """The column keys are matched by: the raw key, or the key and the window start."""
    key, start, raw = (sf.col(f"{prefix}.{c}") for c in ("key", "window_start", "raw_key"))
    windowed = sf.concat(sf.lit("w"), sf.hex(sf.encode(key, "UTF-8")), sf.lit(":"), start)
    return sf.when(start.isNotNull(), windowed).otherwise(sf.concat(sf.lit("k"), sf.hex(raw)))


def _prefixed(side: str) -> list[Column]:
    return [
        sf.col(f"{side}.{c}").alias(f"{side}_{c}")
        for c in ("key", "window_start", "window_end", "value")
    ]


def diff(batch: DataFrame, live: DataFrame, horizons: Mapping[str, int]) -> DataFrame:
    """One row per key of either side (:data:`DIFF_DDL`), with its status."""
    b = _kept(batch, horizons).alias("b")
    s = _kept(live, horizons).alias("s")
    b = b.select("table", _match("b").alias("match"), *_prefixed("b"))
    s = s.select("table", _match("s").alias("match"), *_prefixed("s"))
    joined = b.join(s, ["table", "match"], "full_outer")
    status = (
        sf.when(sf.col("b_key").isNull(), sf.lit(MISSING_IN_BATCH))
        .when(sf.col("s_key").isNull(), sf.lit(MISSING_IN_STREAM))
        .when(
            (sf.col("b_value") == sf.col("s_value"))
            & sf.col("b_window_end").eqNullSafe(sf.col("s_window_end")),
            sf.lit(EQUAL),
        )
        .otherwise(sf.lit(_UNSURE))
    )
    rows = joined.select(
        "table",
        sf.coalesce("b_key", "s_key").alias("key"),
        sf.coalesce("b_window_start", "s_window_start").alias("window_start"),
        sf.col("b_window_end").alias("batch_end"),
        sf.col("s_window_end").alias("stream_end"),
        sf.col("b_value").alias("batch"),
        sf.col("s_value").alias("stream"),
        status.alias("status"),
    )
    sure = rows.where(sf.col("status") != _UNSURE)
    judged = rows.where(sf.col("status") == _UNSURE).mapInArrow(_judge, DIFF_DDL)
    return sure.unionByName(judged)


def summarize(differences: DataFrame, tables: list[str], examples: int) -> dict[str, Any]:
    """Per table: keys compared, the count of each difference, and examples."""
    counts: dict[str, dict[str, int]] = {table: {} for table in tables}
    for row in differences.groupBy("table", "status").count().collect():
        counts.setdefault(row["table"], {})[row["status"]] = row["count"]
    order = Window.partitionBy("table").orderBy("status", "key", "window_start")
    shown: dict[str, list[dict[str, Any]]] = {table: [] for table in tables}
    picked = (
        differences.where(sf.col("status") != EQUAL)
        .withColumn("n", sf.row_number().over(order))
        .where(sf.col("n") <= examples)
        .orderBy("table", "n")
        .collect()
    )
    for row in picked:
        shown.setdefault(row["table"], []).append(example(row.asDict()))
    return _entries(counts, shown)


def _entries(
    counts: Mapping[str, Mapping[str, int]], shown: Mapping[str, list[dict[str, Any]]]
) -> dict[str, Any]:
    """The report's entry of each table: keys compared, each difference counted, and
    the examples shown."""
    return {
        table: {
            "keys_compared": sum(counts[table].values()),
            "mismatched": counts[table].get(MISMATCHED, 0),
            "missing_in_stream": counts[table].get(MISSING_IN_STREAM, 0),
            "missing_in_batch": counts[table].get(MISSING_IN_BATCH, 0),
            "examples": shown.get(table, []),
        }
        for table in counts
    }


def example(row: Mapping[str, Any]) -> dict[str, Any]:
    """One difference as the report shows it."""
    found: dict[str, Any] = {
        "key": row["key"],
        "status": row["status"],
        "batch": loads(row["batch"]),
        "stream": loads(row["stream"]),
    }
    if row["window_start"] is not None:
        end = row["batch_end"] if row["batch_end"] is not None else row["stream_end"]
        found["window"] = {"start": row["window_start"], "end": end}
    return found


def differs(entry: Mapping[str, Any]) -> bool:
    return any(entry[k] for k in DIFFERENCES)


# -- the same, in the driver, for tables small enough to collect ----------------------------


def _kept_rows(rows: pa.Table, horizons: Mapping[str, int]) -> Iterator[dict[str, Any]]:
    """The rows of :func:`_kept`, as dicts."""
    for row in rows.to_pylist():
        horizon = horizons.get(row["table"])
        end = row["window_end"]
        if end is None or horizon is None or end > horizon:
            yield row


def _match_key(row: Mapping[str, Any]) -> tuple[Any, ...]:
    """What :func:`_match` matches by: the raw key, or the key and the window start."""
    if row["window_start"] is not None:
        return ("w", row["key"], row["window_start"])
    return ("k", bytes(row["raw_key"]))


def diff_rows(batch: pa.Table, live: pa.Table, horizons: Mapping[str, int]) -> list[dict[str, Any]]:
    """:func:`diff` on rows held by the driver (:data:`jobs.rows.ROW_SCHEMA`): the same rows,
    as dicts, with the same statuses."""
    sides: dict[tuple[Any, ...], tuple[list[dict[str, Any]], list[dict[str, Any]]]] = {}
    for n, rows in enumerate((batch, live)):
        for row in _kept_rows(rows, horizons):
            sides.setdefault((row["table"], *_match_key(row)), ([], []))[n].append(row)
    found = []
    alone: list[Mapping[str, Any] | None] = [None]
    for b_rows, s_rows in sides.values():
        # a full outer join: every pair, or a row alone when the other side has none
        for b in b_rows or alone:
            for s in s_rows or alone:
                found.append(_diff_row(b, s))
    return found


def _diff_row(b: Mapping[str, Any] | None, s: Mapping[str, Any] | None) -> dict[str, Any]:
    either = b if b is not None else s
    assert either is not None
    b_end = None if b is None else b["window_end"]
    s_end = None if s is None else s["window_end"]
    b_value = None if b is None else b["value"]
    s_value = None if s is None else s["value"]
    if b is None:
        status = MISSING_IN_BATCH
    elif s is None:
        status = MISSING_IN_STREAM
    else:
        status = EQUAL if b_end == s_end and same_json(b_value, s_value) else MISMATCHED
    return {
        "table": either["table"],
        "key": either["key"],
        "window_start": either["window_start"],
        "batch_end": b_end,
        "stream_end": s_end,
        "batch": b_value,
        "stream": s_value,
        "status": status,
    }


def summarize_rows(
    differences: list[dict[str, Any]], tables: list[str], examples: int
) -> dict[str, Any]:
    """:func:`summarize` of :func:`diff_rows`' rows."""
    counts: dict[str, dict[str, int]] = {table: {} for table in tables}
    for row in differences:
        found = counts.setdefault(row["table"], {})
        found[row["status"]] = found.get(row["status"], 0) + 1
    differing = sorted(
        (row for row in differences if row["status"] != EQUAL),
        # Spark's order: strings by their UTF-8 bytes (code points), nulls first
        key=lambda r: (r["status"], r["key"], r["window_start"] is not None, r["window_start"]),
    )
    shown: dict[str, list[dict[str, Any]]] = {table: [] for table in tables}
    for row in differing:
        listed = shown.setdefault(row["table"], [])
        if len(listed) < examples:
            listed.append(example(row))
    return _entries(counts, shown)
