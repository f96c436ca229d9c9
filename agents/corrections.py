"""corrections: the nightly job's repairs, applied by the worker that owns each key.

A correction ``{"table", "key", "value"}`` sets a table key to the batch job's value, or
deletes it when the value is null. The record is keyed by the table's raw key (the word,
the store_id, the category), so it sits in the partition of ``corrections`` that is
co-partitioned with the key's table partition, and this agent's write goes to the right
changelog partition. ``sales_by_category`` keys are ``<category>@<window start ms>``.

A correction may carry ``expected``, the live value the job saw at its cut (null: the
key was absent). It is applied only if the table still holds exactly that value: a key
that changed since the cut keeps its newer value and the correction goes to
``corrections-dlq``; the next run looks at the key again. Invalid corrections go there too.
"""

from __future__ import annotations

import logging
from typing import Annotated, Any

import orjson
from core.models import Correction
from pydantic import BaseModel, ConfigDict, Field, StrictInt, TypeAdapter, ValidationError

from core.semantics import HOUR_MS, InvalidEvent, parse_record
from core.topics import CORRECTIONS, dlq_topic
from tables.definitions import INVENTORY, SALES_BY_CATEGORY, WORD_COUNTS
from tables.pipeline import Batch, Context, Pipeline, TableSpec
from tables.windows import window_key as sales_window_key

logger = logging.getLogger(__name__)

#: Separator of a window key in a sales_by_category correction.
WINDOW_KEY_SEP = "@"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class InventoryValue(_Strict):
    store_id: str
    on_hand: dict[str, StrictInt]
    updated_at: StrictInt


class SalesValue(_Strict):
    units: StrictInt
    revenue: Annotated[float, Field(allow_inf_nan=False)]


_COUNT = TypeAdapter(StrictInt)


def window_key(category: str, start_ms: int) -> str:
    """The correction key of one window of sales_by_category."""
    return f"{category}{WINDOW_KEY_SEP}{start_ms}"


def parse_window_key(key: str) -> tuple[str, int]:
    """``dairy@1700000000000`` -> ("dairy", 1700000000000), or InvalidEvent."""
    category, sep, start = key.rpartition(WINDOW_KEY_SEP)
    if not sep or not category or not start.isdigit() or int(start) % HOUR_MS:
        raise InvalidEvent(f"key: {key[:80]!r} is not <category>@<window start ms>")
    return category, int(start)


def _value(table: str, key: str, value: Any) -> Any:
    """The table value of a correction, validated; None deletes the key."""
    if value is None:
        return None
    try:
        if table == WORD_COUNTS:
            return _COUNT.validate_python(value)
        if table == INVENTORY:
            inventory = InventoryValue.model_validate(value)
            if inventory.store_id != key:
                raise InvalidEvent(f"value.store_id: {inventory.store_id!r} is not the key")
            return inventory.model_dump()
        sales = SalesValue.model_validate(value)
        return {"units": sales.units, "revenue": float(sales.revenue)}
    except ValidationError as error:
        first = error.errors(include_url=False)[0]
        field = ".".join(str(p) for p in first["loc"])
        raise InvalidEvent(f"value{'.' + field if field else ''}: {first['msg']}") from None


def plan(raw_key: bytes | None, raw_value: bytes | None) -> tuple[str, bytes, Any, bool, Any]:
    """Check one ``corrections`` record: (table, table key bytes, value, has expected,
    expected).

    The record key must be the table's raw key: the word, the store_id, or the category.
    """
    correction = parse_record(Correction, raw_value)
    table, key = correction.table, correction.key
    table_key: bytes
    if table == SALES_BY_CATEGORY:
        category, start_ms = parse_window_key(key)
        partition_key, table_key = category, sales_window_key(category, start_ms)
    elif table in (WORD_COUNTS, INVENTORY):
        partition_key, table_key = key, key.encode("utf-8")
    else:
        raise InvalidEvent(f"table: {table[:80]!r} cannot be corrected")
    if raw_key != partition_key.encode("utf-8"):
        shown = (raw_key or b"").decode("utf-8", "replace")[:80]
        raise InvalidEvent(f"key: {shown!r} is not the table's raw key {partition_key[:80]!r}")
    document = orjson.loads(raw_value or b"{}")
    value = _value(table, key, correction.value)
    return table, table_key, value, "expected" in document, document.get("expected")


def apply_corrections(batch: Batch) -> None:
    """Set (or delete) each corrected key, unless it changed since the job's cut."""
    for record in batch.of(CORRECTIONS):
        try:
            name, key, value, has_expected, expected = plan(record.key, record.value)
        except InvalidEvent as error:
            batch.dead_letter(record, error.reason)
            continue
        table = batch.table(name)
        if has_expected and table.get(key) != expected:
            reason = f"stale: {name} {key.decode('utf-8', 'replace')!r} changed since the batch cut"
            batch.dead_letter(record, reason)
            continue
        if value is None:
            table.delete(key)
        else:
            table.put(key, value)
        logger.info("correction applied to %s %r", name, key)


def pipelines(context: Context) -> list[Pipeline]:
    return [
        Pipeline(
            name="corrections.apply",
            reads=(CORRECTIONS,),
            writes=(
                TableSpec(WORD_COUNTS, queryable=True),
                TableSpec(INVENTORY, queryable=True),
                TableSpec(SALES_BY_CATEGORY, ordered=True, queryable=True),
            ),
            produces=(dlq_topic(CORRECTIONS),),
            process=apply_corrections,
        )
    ]
