"""Settling: sales joined with the payments that settle them (item-events x payments).

A payment settles the sale whose ``event_id`` is its ``sale_event_id`` when its ``ts``
lies in ``[sale.ts, sale.ts + 10 min]``. Settled pairs go to ``settled-sales``; a sale
that nothing settled counts in ``unsettled_sales`` once event time on both topics'
partitions of its store has passed ``sale.ts + 10 min``. The join is tables/join.py's,
its buffer and index two tables of the same partition.

Both topics are co-partitioned by store, so one batch holds a partition of each, and
every table write for a store lands in that store's partition. A batch applies its
records, expires the buffers once, and writes each store's unsettled count once.
"""

from __future__ import annotations

import functools

from core.semantics import InvalidEvent, check_key, read_item_event, read_payment
from core.topics import ITEM_EVENTS, PAYMENTS, SETTLED_SALES, dlq_topic
from tables.definitions import UNSETTLED_SALES
from tables.join import LEFT, RIGHT, JoinWindow, PartitionJoin
from tables.pipeline import Batch, Context, Pipeline, TableSpec

#: A payment settles a sale when it is at most this long after the sale (inclusive).
SETTLE_WINDOW_MS = 10 * 60 * 1000
#: Payments have no grace: once payments' event time has passed a sale's window, the sale
#: is decided, as the contract says, and a payment arriving later settles nothing. Sales
#: have the window's length: a sale up to 10 minutes behind its topic's event time still
#: finds every payment of its window, so payments are kept until item-events' event time
#: has passed the end of every window they could fall in.
SETTLE_WINDOW = JoinWindow(
    before_ms=0,
    after_ms=SETTLE_WINDOW_MS,
    left_grace_ms=SETTLE_WINDOW_MS,
    right_grace_ms=0,
)
#: The join's buffered sales and payments by event id, and its index by event time.
SETTLING_BUFFER = "settling_buffer"
SETTLING_INDEX = "settling_index"


def settle(batch: Batch, *, max_bytes: int, window: JoinWindow = SETTLE_WINDOW) -> None:
    """One partition's item events and payments through the join."""
    join = PartitionJoin(window, batch.table(SETTLING_BUFFER), batch.table(SETTLING_INDEX))
    parsed = batch.parsed(ITEM_EVENTS, read_item_event, max_bytes, InvalidEvent)
    for record, item in zip(batch.of(ITEM_EVENTS), parsed, strict=True):
        try:
            if isinstance(item, Exception):  # what read_item_event refused
                raise item
            check_key(record.key, item.store_id, "store_id")
        except InvalidEvent:
            # inventory.apply_store_events reads the same records and dead-letters the
            # invalid ones; doing it here too would put every bad record in the DLQ twice.
            continue
        if item.kind == "sale":
            # Buffered as the store and the record's JSON text: cheap to keep and to read
            # back, and written into a settled pair as it is.
            sale = [item.store_id, item.json.decode()]
            join.process(LEFT, item.ts, record.offset, item.event_id, sale)
        else:  # restocks and adjustments only move the topic's event time
            join.process(LEFT, item.ts, record.offset, None)
    for record in batch.of(PAYMENTS):
        try:
            payment = read_payment(record.value, max_bytes)
            check_key(record.key, payment.store_id, "store_id")
        except InvalidEvent as error:
            batch.dead_letter(record, error.reason)
            continue
        join.process(RIGHT, payment.ts, record.offset, payment.sale_event_id, payment.json.decode())
    result = join.finish()
    for (store, sale_json), payment_json in result.pairs:
        pair = b'{"sale":' + sale_json.encode() + b',"payment":' + payment_json.encode() + b"}"
        batch.send(SETTLED_SALES, store.encode(), pair)
    if result.unmatched:
        counts = batch.table(UNSETTLED_SALES)
        added: dict[bytes, int] = {}
        for store_id, _sale_json in result.unmatched:
            store = store_id.encode()
            added[store] = added.get(store, 0) + 1
        for store, n in added.items():
            counts.put(store, int(counts.get(store) or 0) + n)


#: Expired join records leave tombstones; rolling segments every 10 minutes lets the
#: broker compact them away instead of keeping a week of history.
BUFFER_CHANGELOG = (("segment.ms", str(10 * 60 * 1000)),)


def pipelines(context: Context) -> list[Pipeline]:
    return [
        Pipeline(
            name="settling.settle_sales",
            reads=(ITEM_EVENTS, PAYMENTS),
            writes=(
                TableSpec(SETTLING_BUFFER, changelog_config=BUFFER_CHANGELOG),
                TableSpec(SETTLING_INDEX, ordered=True, changelog_config=BUFFER_CHANGELOG),
                TableSpec(UNSETTLED_SALES, queryable=True),
            ),
            produces=(SETTLED_SALES, dlq_topic(PAYMENTS)),
            process=functools.partial(settle, max_bytes=context.max_event_bytes),
        )
    ]
