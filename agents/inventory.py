"""inventory and the sales feed: item-events keyed by store_id.

Each valid event updates the store's stock; each sale is enriched with its product's
category (as of the sale's event time) and re-keyed by category for sales_by_category.
The agent works per fetched batch of one source partition (``tables/batch.py``): each
store's value is read once, every event of the batch applied to it in offset order, and
written once.
"""

from __future__ import annotations

from typing import Any

import faust
import orjson

from agents.dlq import DeadLetters
from app.semantics import (
    InvalidEvent,
    apply_inventory,
    check_key,
    parse_item_event,
    sale_revenue,
)
from app.settings import Settings
from tables.batch import BatchProcessor, Output, PartitionBatch, decode_value, encode_value, read
from tables.catalog import ProductCatalog

SALES_REPARTITION_TOPIC = "streamstate-sales_by_category-repartition"


def inventory_batch(
    tp: Any,
    events: list[Any],
    settings: Settings,
    inventory: Any,
    catalog: ProductCatalog,
    dlq: DeadLetters,
) -> PartitionBatch:
    """One partition's store events -> each store's new stock, written once, and the
    batch's sales re-keyed by category (dead letters for the invalid events)."""
    batch = PartitionBatch(tp, max(event.message.offset for event in events))
    stores: dict[bytes, Any] = {}
    for event in events:
        try:
            item = parse_item_event(event.value, settings.max_event_bytes)
            check_key(event.key, item.store_id, "store_id")
        except InvalidEvent as error:
            batch.send(dlq.record(event, error.reason))
            continue
        key = item.store_id.encode("utf-8")
        if key not in stores:
            current = read(inventory, tp.partition, key)
            stores[key] = None if current is None else decode_value(inventory, current)
        stores[key] = apply_inventory(stores[key], item)
        if item.kind == "sale":
            sale = {
                "units": item.quantity,
                "revenue": sale_revenue(item),
                "ts": item.ts,
                "event_id": item.event_id,
            }
            category = catalog.category_at(item.sku, item.ts)
            # The record timestamp is the sale's event time: the windowed table assigns
            # windows from it.
            batch.send(
                Output(
                    SALES_REPARTITION_TOPIC,
                    category.encode("utf-8"),
                    orjson.dumps(sale),
                    timestamp_ms=item.ts,
                )
            )
    for key, state in stores.items():
        batch.set(inventory, key, encode_value(inventory, state))
    return batch


def register(
    app: faust.App,
    settings: Settings,
    source: Any,
    inventory: Any,
    catalog: ProductCatalog,
    dlq: DeadLetters,
    processor: BatchProcessor,
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
    processor.gate_topic(source, contiguous=True)
    size, within = settings.batch_max_events, settings.batch_within_s

    @app.agent(source, name="inventory.apply_store_events")
    async def apply_store_events(stream: Any) -> None:
        async for events in stream.take_events(size, within):
            await catalog.wait_caught_up()
            await processor.run(
                events,
                lambda tp, group: inventory_batch(tp, group, settings, inventory, catalog, dlq),
                [inventory],
            )

    return sales_by_category
