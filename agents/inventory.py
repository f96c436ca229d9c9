"""inventory and the sales feed: item-events keyed by store_id.

Each valid event updates the store's stock; each sale is enriched with its product's
category (as of the sale's event time) and re-keyed by category for sales_by_category.
"""

from __future__ import annotations

from typing import Any

import faust
from faust import StreamT

from agents.dlq import DeadLetters
from app.semantics import (
    InvalidEvent,
    apply_inventory,
    check_key,
    parse_item_event,
    sale_revenue,
)
from app.settings import Settings
from tables.catalog import ProductCatalog

SALES_REPARTITION_TOPIC = "streamstate-sales_by_category-repartition"


def register(
    app: faust.App,
    settings: Settings,
    source: Any,
    inventory: Any,
    catalog: ProductCatalog,
    dlq: DeadLetters,
) -> Any:
    """Declare the inventory agent; return the sales-by-category repartition topic."""
    sales_by_category = app.topic(
        SALES_REPARTITION_TOPIC,
        key_type=bytes,
        key_serializer="raw",
        value_serializer="json",
        partitions=settings.topic_partitions,
        internal=True,
    )

    @app.agent(source, name="inventory.apply_store_events")
    async def apply_store_events(stream: StreamT[bytes]) -> None:
        async for event in stream.events():
            try:
                item = parse_item_event(event.value, settings.max_event_bytes)
                check_key(event.key, item.store_id, "store_id")
            except InvalidEvent as error:
                await dlq.send(event, error.reason)
                continue
            key = item.store_id.encode("utf-8")
            inventory[key] = apply_inventory(inventory.get(key), item)
            if item.kind == "sale":
                await catalog.wait_caught_up()
                category = catalog.category_at(item.sku, item.ts)
                sale = {
                    "units": item.quantity,
                    "revenue": sale_revenue(item),
                    "ts": item.ts,
                    "event_id": item.event_id,
                }
                # The record timestamp is the sale's event time: the windowed table
                # assigns windows from it.
                await sales_by_category.send(
                    key=category.encode("utf-8"), value=sale, timestamp=item.ts / 1000.0
                )

    return sales_by_category
