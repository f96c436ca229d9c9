"""sales_by_category: tumbling 1-hour windows on event time, per category.

The agent works per fetched batch of one partition of the sales repartition topic
(``tables/batch.py``): each window a batch touches is read once, every sale of the batch
added to it, and written once, under the key faust's windowed table uses
(``[category, [start_s, end_s]]``). A sale's window follows its record timestamp, which
is the sale's ``ts``.
"""

from __future__ import annotations

from typing import Any

import faust

from app.semantics import add_sale
from app.settings import Settings
from tables.batch import BatchProcessor, PartitionBatch, decode_value, encode_value, read


def sales_batch(tp: Any, events: list[Any], windowed: Any) -> tuple[PartitionBatch, list[Any]]:
    """One partition's re-keyed sales -> the new totals of the windows they fall in (and
    the windows' table keys)."""
    table = windowed.table
    store = table.data
    batch = PartitionBatch(tp, max(event.message.offset for event in events))
    totals: dict[Any, dict[str, Any]] = {}
    encoded: dict[Any, bytes] = {}
    for event in events:
        category = event.key.decode("utf-8")
        sale = event.value
        for window in table.window.ranges(event.message.timestamp):
            key = (category, window)
            if key not in totals:
                encoded[key] = store._encode_key(key)
                current = read(table, tp.partition, encoded[key])
                totals[key] = {} if current is None else decode_value(table, current)
            totals[key] = add_sale(totals[key], int(sale["units"]), float(sale["revenue"]))
    for key, value in totals.items():
        batch.set(table, encoded[key], encode_value(table, value))
    return batch, list(totals)


def register(
    app: faust.App,
    settings: Settings,
    source: Any,
    sales_by_category: Any,
    processor: BatchProcessor,
) -> None:
    """Declare the agent that folds re-keyed sales into their windows."""
    table = sales_by_category.table
    processor.gate_topic(source)
    size, within = settings.batch_max_events, settings.batch_within_s

    def build(tp: Any, group: list[Any]) -> PartitionBatch:
        batch, keys = sales_batch(tp, group, sales_by_category)
        for key in keys:
            # Windows past the table's expiry are removed as faust removes its own.
            table._maybe_set_key_ttl(key, tp.partition)
        return batch

    @app.agent(source, name="sales.count_sales")
    async def count_sales(stream: Any) -> None:
        async for events in stream.take_events(size, within):
            await processor.run(events, build, [table])
