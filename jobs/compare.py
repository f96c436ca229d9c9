"""Reconciliation: the batch view of a table against the live one, key by key.

Every value is compared exactly, except revenue, a floating sum whose rounding depends
on the order of its terms: two revenues are equal within ``REVENUE_TOLERANCE``
(relative, and absolute below 1).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as sf

Columns = dict[str, Column]

REVENUE_TOLERANCE = 1e-9
EQUAL = "equal"
MISMATCHED = "mismatched"
MISSING_IN_STREAM = "missing_in_stream"
MISSING_IN_BATCH = "missing_in_batch"
DIFFERENCES = (MISMATCHED, MISSING_IN_STREAM, MISSING_IN_BATCH)


def _sorted_entries(column: Column) -> Column:
    return sf.array_sort(sf.map_entries(column))


def _same_word_count(b: Columns, s: Columns) -> Column:
    return b["count"] == s["count"]


def _same_inventory(b: Columns, s: Columns) -> Column:
    return (
        (b["store_id"] == s["store_id"])
        & (_sorted_entries(b["on_hand"]) == _sorted_entries(s["on_hand"]))
        & (b["updated_at"] == s["updated_at"])
    )


def _same_sales(b: Columns, s: Columns) -> Column:
    scale = sf.greatest(sf.lit(1.0), sf.abs(b["revenue"]), sf.abs(s["revenue"]))
    close = sf.abs(b["revenue"] - s["revenue"]) <= sf.lit(REVENUE_TOLERANCE) * scale
    return (b["units"] == s["units"]) & close


@dataclass(frozen=True)
class TableSpec:
    """How one table is keyed, compared and written as a correction."""

    name: str
    changelog: str
    same: Callable[[Columns, Columns], Column]
    value_fields: tuple[str, ...]

    def raw_key(self, key: str, row_category: str | None) -> bytes:
        """The table's raw key: the bytes the stream partitions the key by."""
        return (row_category if row_category is not None else key).encode("utf-8")


def specs(app_id: str) -> dict[str, TableSpec]:
    def changelog(table: str) -> str:
        return f"{app_id}-{table}-changelog"

    return {
        "word_counts": TableSpec(
            "word_counts", changelog("word_counts"), _same_word_count, ("count",)
        ),
        "inventory": TableSpec(
            "inventory",
            changelog("inventory"),
            _same_inventory,
            ("store_id", "on_hand", "updated_at"),
        ),
        "sales_by_category": TableSpec(
            "sales_by_category",
            changelog("sales_by_category"),
            _same_sales,
            ("units", "revenue"),
        ),
    }


def batch_json(spec: TableSpec, b: Columns) -> Column:
    """The batch value as the table's JSON value."""
    if spec.value_fields == ("count",):
        return b["count"].cast("string")
    return sf.to_json(sf.struct(*[b[f].alias(f) for f in spec.value_fields]))


def diff(spec: TableSpec, batch: DataFrame, stream: DataFrame) -> DataFrame:
    """One row per key of either side: ``key``, ``category``, ``status``, ``batch`` (JSON),
    ``stream`` (the changelog's JSON)."""
    b, s = batch.alias("b"), stream.alias("s")
    joined = b.join(s, sf.col("b.key") == sf.col("s.key"), "full_outer")
    bcol = {c: sf.col(f"b.{c}") for c in batch.columns}
    scol = {c: sf.col(f"s.{c}") for c in stream.columns}
    status = (
        sf.when(bcol["key"].isNull(), sf.lit(MISSING_IN_BATCH))
        .when(scol["key"].isNull(), sf.lit(MISSING_IN_STREAM))
        .when(sf.coalesce(spec.same(bcol, scol), sf.lit(False)), sf.lit(EQUAL))
        .otherwise(sf.lit(MISMATCHED))
    )
    category = (
        sf.coalesce(bcol["category"], scol["category"])
        if "category" in batch.columns
        else sf.lit(None)
    )
    return joined.select(
        sf.coalesce(bcol["key"], scol["key"]).alias("key"),
        category.cast("string").alias("category"),
        status.alias("status"),
        sf.when(bcol["key"].isNotNull(), batch_json(spec, bcol)).alias("batch"),
        scol["raw"].alias("stream"),
    )


def _loads(text: str | None) -> Any:
    """A JSON value, or the text itself when it is not JSON (a corrupt live value)."""
    if text is None:
        return None
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return text


def summarize(differences: DataFrame, examples: int) -> dict[str, Any]:
    """The report entry of one table."""
    counts = {
        row["status"]: row["n"]
        for row in differences.groupBy("status").agg(sf.count("*").alias("n")).collect()
    }
    shown = (
        differences.where(sf.col("status") != EQUAL)
        .orderBy("status", "key")
        .limit(examples)
        .collect()
    )
    return {
        "keys_compared": sum(counts.values()),
        "mismatched": counts.get(MISMATCHED, 0),
        "missing_in_stream": counts.get(MISSING_IN_STREAM, 0),
        "missing_in_batch": counts.get(MISSING_IN_BATCH, 0),
        "examples": [
            {
                "key": row["key"],
                "status": row["status"],
                "batch": _loads(row["batch"]),
                "stream": _loads(row["stream"]),
            }
            for row in shown
        ],
    }


def corrections(spec: TableSpec, differences: DataFrame) -> Iterator[tuple[bytes, bytes]]:
    """The ``corrections`` records of a table's differing keys: the batch value, or null
    (delete) for a key the batch does not have; ``expected`` is the live value at the cut,
    so that a worker can refuse a correction for a key that changed since."""
    rows = differences.where(sf.col("status") != EQUAL).toLocalIterator()
    for row in rows:
        record = {"table": spec.name, "key": row["key"], "value": _loads(row["batch"])}
        # A corrupt live value gets no "expected": it is replaced whatever it is.
        with contextlib.suppress(orjson.JSONDecodeError):
            record["expected"] = None if row["stream"] is None else orjson.loads(row["stream"])
        yield spec.raw_key(row["key"], row["category"]), orjson.dumps(record)
