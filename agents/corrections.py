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

import faust
import orjson
from faust import StreamT
from pydantic import BaseModel, ConfigDict, Field, StrictInt, TypeAdapter, ValidationError

from agents.dlq import DeadLetters
from agents.raw import raw_topic
from app.models import Correction
from app.semantics import HOUR_MS, InvalidEvent, parse_record
from app.settings import Settings
from app.topics import CORRECTIONS, topic_specs
from tables.batch import BatchProcessor
from tables.definitions import INVENTORY, SALES_BY_CATEGORY, SALES_WINDOW_S, WORD_COUNTS, Tables

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


def faust_window(start_ms: int) -> tuple[float, float]:
    """The window range faust keys a tumbling hour by (``end = start + size - 0.1``)."""
    start = float(start_ms // 1000)
    return (start, start + SALES_WINDOW_S - 0.1)


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


def plan(raw_key: bytes | None, raw_value: bytes | None) -> tuple[str, Any, Any, bool, Any]:
    """Check one ``corrections`` record: (table, table key, value, has expected, expected).

    The record key must be the table's raw key: the word, the store_id, or the category.
    """
    correction = parse_record(Correction, raw_value)
    table, key = correction.table, correction.key
    table_key: Any
    if table == SALES_BY_CATEGORY:
        category, start_ms = parse_window_key(key)
        partition_key, table_key = category, (category, faust_window(start_ms))
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


def _targets(tables: Tables) -> dict[str, Any]:
    return {
        WORD_COUNTS: tables.word_counts,
        INVENTORY: tables.inventory,
        # Windows are written by their (key, (start, end)) on the underlying table.
        SALES_BY_CATEGORY: tables.sales_by_category.table,
    }


def register(
    app: faust.App, settings: Settings, tables: Tables, processor: BatchProcessor
) -> DeadLetters:
    """Declare the corrections agent; return its dead-letter sender."""
    spec = next(
        s
        for s in topic_specs(settings.topic_partitions, settings.source_retention_ms)
        if s.name == CORRECTIONS
    )
    source = raw_topic(app, spec)
    dlq = DeadLetters(app, [CORRECTIONS], settings.topic_partitions, settings.source_retention_ms)
    targets = _targets(tables)

    @app.agent(source, name="corrections.apply")
    async def apply_corrections(stream: StreamT[bytes]) -> None:
        async for event in stream.events():
            try:
                name, key, value, has_expected, expected = plan(event.key, event.value)
            except InvalidEvent as error:
                await dlq.send(event, error.reason)
                continue
            table = targets[name]
            # A batched agent's read-modify-write of this partition must not straddle it.
            async with processor.lock(table, event.message.partition):
                current = table.data.get(key) if key in table else None
                if has_expected and current != expected:
                    reason = f"stale: {name} {key!r} changed since the batch cut"
                    await dlq.send(event, reason)
                    continue
                if value is None:
                    if key in table:
                        del table[key]
                else:
                    table[key] = value
            logger.info("correction applied to %s %r", name, key)

    return dlq
