"""inventory and the sales feed: item-events keyed by store_id.

Each valid event updates the store's stock; each sale is enriched with its product's
category as of the sale's event time. A batch reads each store once, applies its events
in offset order and writes the store once; it sums its sales per (category, hour) and
sends one record per sum, keyed by category, to the sales repartition topic, where
``sales.count`` adds them into ``sales_by_category``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Protocol

import orjson

from core.semantics import (
    InvalidEvent,
    add_to_inventory,
    check_key,
    read_item_event,
    sale_revenue,
    window_start,
    working_inventory,
)
from core.topics import ITEM_EVENTS, dlq_topic
from tables.definitions import INVENTORY
from tables.pipeline import Batch, Context, Pipeline, TableSpec

SALES_REPARTITION_TOPIC = "streamstate-sales_by_category-repartition"


class Catalogue(Protocol):
    def category_at(self, sku: str, at_ms: int) -> str: ...


def sale_sums(category: str, start_ms: int, units: int, revenue: float, sales: int) -> bytes:
    """The value of one sales repartition record: a batch's sales of one (category, hour)."""
    return orjson.dumps(
        {"window_start": start_ms, "units": units, "revenue": revenue, "sales": sales}
    )


def apply_store_events(batch: Batch, *, catalogue: Catalogue, max_bytes: int) -> None:
    """One partition's store events -> each store's new stock, written once, and the
    batch's sales summed per (category, hour) (dead letters for the invalid events)."""
    table = batch.table(INVENTORY)
    stores: dict[bytes, dict[str, Any]] = {}
    sums: dict[tuple[str, int], list[Any]] = {}
    category_at = catalogue.category_at
    parsed = batch.parsed(ITEM_EVENTS, read_item_event, max_bytes, InvalidEvent)
    for record, item in zip(batch.of(ITEM_EVENTS), parsed, strict=True):
        try:
            if isinstance(item, Exception):  # what read_item_event refused
                raise item
            check_key(record.key, item.store_id, "store_id")
        except InvalidEvent as error:
            batch.dead_letter(record, error.reason)
            continue
        key: bytes = record.key  # type: ignore[assignment]  # check_key: not None
        state = stores.get(key)
        if state is None:
            state = stores[key] = working_inventory(table.get(key), item.store_id)
        add_to_inventory(state, item)
        if item.kind == "sale":
            where = (category_at(item.sku, item.ts), window_start(item.ts))
            revenue = sale_revenue(item)
            total = sums.get(where)
            if total is None:
                sums[where] = [item.quantity, revenue, 1]
            else:
                total[0] += item.quantity
                total[1] += revenue
                total[2] += 1
    for key, state in stores.items():
        table.put(key, state)
    for (category, start), (units, revenue, sales) in sums.items():
        # The value names the hour it is counted in; the record keeps the engine's
        # timestamp (its inputs'), which the topic takes whatever the sales' event time.
        batch.send(
            SALES_REPARTITION_TOPIC,
            category.encode("utf-8"),
            sale_sums(category, start, units, revenue, sales),
        )


def pipelines(context: Context) -> list[Pipeline]:
    process: Callable[[Batch], None] = functools.partial(
        apply_store_events, catalogue=context.catalogue, max_bytes=context.max_event_bytes
    )
    return [
        Pipeline(
            name="inventory.apply_store_events",
            reads=(ITEM_EVENTS,),
            writes=(TableSpec(INVENTORY, queryable=True),),
            produces=(SALES_REPARTITION_TOPIC, dlq_topic(ITEM_EVENTS)),
            process=process,
        )
    ]
