"""Settling: sales joined with the payments that settle them.

A payment settles the sale whose ``event_id`` is its ``sale_event_id`` when its ``ts``
lies in ``[sale.ts, sale.ts + 10 min]``. Settled pairs go to ``settled-sales``; a sale
that nothing settled counts in ``unsettled_sales`` once event time on both topics'
partitions of its store has passed ``sale.ts + 10 min``. Both topics are keyed and
partitioned by store, so a sale and its payments meet in one partition.
"""

from __future__ import annotations

from typing import NamedTuple

from agents.schemas import (
    ITEM_EVENT,
    ITEM_EVENTS,
    PAYMENT,
    PAYMENTS,
    SETTLED_SALES,
    PaymentEvent,
    StoreEvent,
)
from streams import Context, JoinWindow, Topology

UNSETTLED_SALES = "unsettled_sales"
#: A payment settles a sale when it is at most this long after the sale (inclusive).
SETTLE_WINDOW_MS = 10 * 60 * 1000
#: Payments have no grace: once payments' event time has passed a sale's window, the sale
#: is decided, and a payment arriving later settles nothing. Sales have the window's
#: length: a sale up to 10 minutes behind its topic's event time still finds every
#: payment of its window.
SETTLE_WINDOW = JoinWindow(
    before_ms=0, after_ms=SETTLE_WINDOW_MS, left_grace_ms=SETTLE_WINDOW_MS, right_grace_ms=0
)


class Settlement(NamedTuple):
    """A sale and the payment that settled it (None: nothing did)."""

    sale: StoreEvent
    payment: PaymentEvent | None


def is_sale(event: StoreEvent) -> bool:
    return event.kind == "sale"


def event_id(sale: StoreEvent) -> str:
    return sale.event_id


def settled_event(payment: PaymentEvent) -> str:
    return payment.sale_event_id


def is_settled(settlement: Settlement) -> bool:
    return settlement.payment is not None


def pair_json(settlement: Settlement) -> bytes:
    """``{"sale": <the sale event>, "payment": <the payment>}``, each as it was sent."""
    assert settlement.payment is not None
    return b'{"sale":' + settlement.sale.json + b',"payment":' + settlement.payment.json + b"}"


def pipelines(context: Context) -> Topology:
    topology = Topology("settling")
    events = topology.source(ITEM_EVENTS, ITEM_EVENT, key="store_id", timestamp="ts")
    payments = topology.source(PAYMENTS, PAYMENT, key="store_id", timestamp="ts")
    settlements = events.filter(is_sale).join(
        payments,
        Settlement,
        how="left",
        key=event_id,
        other_key=settled_event,
        window=SETTLE_WINDOW,
        name="settle",
    )
    settled, unsettled = settlements.branch(is_settled, name="paid")
    settled.to(SETTLED_SALES, value=pair_json)
    unsettled.group_by_key().count(UNSETTLED_SALES)
    return topology
