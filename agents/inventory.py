"""Inventory: each store's stock per sku, from its sales, restocks and adjustments.

A sale subtracts its quantity, a restock adds it, an adjustment adds its signed
quantity; ``updated_at`` is the largest event time applied. Item events are keyed by
their store, so each store's events are folded where they are read, in offset order,
the store's value read and written once per batch.
"""

from __future__ import annotations

from typing import Any

from agents.schemas import ITEM_EVENT, ITEM_EVENTS, StoreEvent
from streams import Context, Topology

INVENTORY = "inventory"


def empty_store() -> dict[str, Any]:
    return {"store_id": None, "on_hand": {}, "updated_at": None}


def stock_change(event: StoreEvent) -> int:
    """How an event changes on-hand stock: a sale subtracts, the others add."""
    return -event.quantity if event.kind == "sale" else event.quantity


def apply_event(store_id: str, event: StoreEvent, store: dict[str, Any]) -> dict[str, Any]:
    """A store's inventory after one more event (changed in place)."""
    on_hand = store["on_hand"]
    on_hand[event.sku] = on_hand.get(event.sku, 0) + stock_change(event)
    store["store_id"] = event.store_id
    if store["updated_at"] is None or event.ts > store["updated_at"]:
        store["updated_at"] = event.ts
    return store


def pipelines(context: Context) -> Topology:
    topology = Topology("inventory")
    events = topology.source(ITEM_EVENTS, ITEM_EVENT, key="store_id", timestamp="ts")
    events.group_by_key().aggregate(INVENTORY, empty_store, apply_event)
    return topology
