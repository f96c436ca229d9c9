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
    app: faust.App, settings: Settings, unsettled_sales: Any, dlq: DeadLetters
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
    join = StreamJoin(
        app,
        JOIN_NAME,
        SETTLE_WINDOW,
        partitions=settings.topic_partitions,
        left="sales",
        right="payments",
        on_changelog_event=_restore_counter(app),
    )

    @app.agent(both, name="settling.settle_sales")
    async def settle_sales(stream: StreamT[bytes]) -> None:
        async for event in stream.events():
            if event.message.topic == ITEM_EVENTS:
                result = _on_item_event(join, event, settings)
            else:
                try:
                    result = _on_payment(join, event, settings)
                except InvalidEvent as error:
                    await dlq.send(event, error.reason)
                    continue
            if result is None:
                continue
            for sale, payment in result.pairs:
                key = str(sale["store_id"]).encode("utf-8")
                pair = orjson.dumps({"sale": sale, "payment": payment})
                await _publish(app, settled, event, key, pair)
            for sale in result.unmatched:
                unsettled_sales[str(sale["store_id"]).encode("utf-8")] += 1

    return join


async def _publish(app: faust.App, topic: Any, event: Any, key: bytes, value: bytes) -> None:
    """Send a record, under exactly-once inside the transaction of the event's partition.

    faust picks a send's transaction from its consumer's metadata of the destination
    topic; a topic the app only writes to is unknown there, and faust then sends outside
    every transaction, so a crash would publish pairs that the replay publishes again.
    """
    if not app.in_transaction:
        await topic.send(key=key, value=value)
        return
    message = event.message
    group = app.assignor.group_for_topic(message.topic)
    transactional_id = f"{app.conf.id}-{group}-{message.partition}"
    await app.producer.send(
        topic.get_topic_name(), key, value, None, None, None, transactional_id=transactional_id
    )


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
