"""Settling: sales joined with the payments that settle them (item-events x payments).

A payment settles the sale whose ``event_id`` is its ``sale_event_id`` when its ``ts``
lies in ``[sale.ts, sale.ts + 10 min]``. Settled pairs go to ``settled-sales``; a sale
that nothing settled counts in ``unsettled_sales`` once event time on both topics'
partitions of its store has passed ``sale.ts + 10 min``. The join is tables/join.py's.

One agent consumes both topics, so both sides of a partition meet in one stream and every
table write for a store lands in that store's partition.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import faust
import orjson
from faust import StreamT

from agents.dlq import DeadLetters
from app.semantics import InvalidEvent, check_key, parse_item_event, parse_payment
from app.settings import Settings
from app.topics import ITEM_EVENTS, PAYMENTS, SETTLED_SALES
from tables.batch import APPLIED_TABLE, BatchProcessor
from tables.exactly_once import ExactlyOnceState
from tables.join import LEFT, RIGHT, JoinResult, JoinWindow, StreamJoin
from tables.restore import TrackedRecovery

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
JOIN_NAME = "settling"


def register(
    app: faust.App,
    settings: Settings,
    unsettled_sales: Any,
    dlq: DeadLetters,
    processor: BatchProcessor,
) -> StreamJoin:
    """Declare the settling agent; return its join (whose tables hold the buffers)."""
    both = app.topic(
        ITEM_EVENTS,
        PAYMENTS,
        key_type=bytes,
        value_type=bytes,
        key_serializer="raw",
        value_serializer="raw",
        partitions=settings.topic_partitions,
    )
    settled = app.topic(
        SETTLED_SALES,
        key_type=bytes,
        value_type=bytes,
        key_serializer="raw",
        value_serializer="raw",
        partitions=settings.topic_partitions,
    )
    state = ExactlyOnceState(
        app,
        JOIN_NAME,
        partitions=settings.topic_partitions,
        on_changelog_event=_restore_counter(app),
    )
    # item-events has one committed offset for this agent and the inventory agent's
    # batches, which commit it: no further than this agent has gone.
    processor.share(
        ITEM_EVENTS,
        state.progress,
        partitions=settings.topic_partitions,
        on_changelog_event=_restore_counter(app)(APPLIED_TABLE),
    )
    join = StreamJoin(state, JOIN_NAME, SETTLE_WINDOW, left="sales", right="payments")
    # The counts live beside the join's buffers and are restored with them; unsettled_sales
    # receives their absolute values, so rewriting one can never count a sale twice.
    counts = state.table(
        f"{JOIN_NAME}_unsettled", default=None, help="settling: unsettled sales per store"
    )

    @app.agent(both, name="settling.settle_sales")
    async def settle_sales(stream: StreamT[bytes]) -> None:
        async for event in stream.events():
            if state.replayed(event):
                continue
            result: JoinResult | None = None
            if event.message.topic == ITEM_EVENTS:
                result = _on_item_event(join, event, settings)
            else:
                try:
                    result = _on_payment(join, event, settings)
                except InvalidEvent as error:
                    await dlq.send(event, error.reason)
            if result is not None:
                for sale, payment in result.pairs:
                    pair = orjson.dumps({"sale": sale, "payment": payment})
                    state.send(settled, _store_key(sale), pair)
                for sale in result.unmatched:
                    store = _store_key(sale)
                    count = int(counts.get(store) or 0) + 1
                    counts[store] = count
                    state.write(unsettled_sales, store, count)
            # Every event, even one that changed nothing: how far this agent has gone
            # bounds the offset the inventory agent's batches commit for item-events.
            await state.commit_event(event)

    return join


def _store_key(record: dict[str, Any]) -> bytes:
    return str(record["store_id"]).encode("utf-8")


def _on_item_event(join: StreamJoin, event: Any, settings: Settings) -> JoinResult | None:
    try:
        item = parse_item_event(event.value, settings.max_event_bytes)
        check_key(event.key, item.store_id, "store_id")
    except InvalidEvent:
        # The inventory agent consumes the same records and dead-letters the invalid
        # ones; reporting them here too would put every bad record in the DLQ twice.
        return None
    if item.kind != "sale":
        # Restocks and adjustments only move the topic's event time.
        return join.process(event, LEFT, item.ts, None)
    sale = orjson.loads(event.value)
    return join.process(event, LEFT, item.ts, item.event_id.encode("utf-8"), sale)


def _on_payment(join: StreamJoin, event: Any, settings: Settings) -> JoinResult:
    payment = parse_payment(event.value, settings.max_event_bytes)
    check_key(event.key, payment.store_id, "store_id")
    value = orjson.loads(event.value)
    return join.process(event, RIGHT, payment.ts, payment.sale_event_id.encode("utf-8"), value)


def _restore_counter(app: faust.App) -> Callable[[str], Callable[[Any], Any]]:
    """Count the join tables' restored changelog records like every other table's."""

    def for_table(name: str) -> Callable[[Any], Any]:
        async def on_changelog_event(event: Any) -> None:
            recovery = getattr(app.tables, "recovery", None)
            if isinstance(recovery, TrackedRecovery):
                recovery.count(name, active=event.message.tp in recovery.active_tps)

        return on_changelog_event

    return for_table
