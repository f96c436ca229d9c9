"""Sales by category: units and revenue per product category, in 1-hour windows of
event time.

Each sale takes the category its sku had in the product catalogue at the sale's event
time (``"unknown"`` when the catalogue has no such sku then), and counts in the
tumbling hour that holds its ``ts``. Sales cross a repartition topic to their
category's partition, summed per batch and window first.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, NamedTuple

from agents.schemas import ITEM_EVENT, ITEM_EVENTS, PRODUCT, PRODUCTS, Product, StoreEvent
from streams import Context, Topology, Tumbling

SALES_BY_CATEGORY = "sales_by_category"
#: The category of a sale whose sku is not in the catalogue.
UNKNOWN_CATEGORY = "unknown"
HOUR = timedelta(hours=1)


def is_sale(event: StoreEvent) -> bool:
    return event.kind == "sale"


def sku_of(event: StoreEvent) -> str:
    return event.sku


class Sale(NamedTuple):
    """A sale with its category, units and revenue (quantity x unit price)."""

    category: str
    units: int
    revenue: float


def categorized(sale: StoreEvent, product: Product | None) -> Sale:
    category = UNKNOWN_CATEGORY if product is None else product.category
    return Sale(category, sale.quantity, sale.quantity * (sale.unit_price or 0.0))


def category_of(sale: Sale) -> str:
    return sale.category


def no_sales() -> dict[str, Any]:
    return {"units": 0, "revenue": 0.0}


def add_sale(category: str, sale: Sale, total: dict[str, Any]) -> dict[str, Any]:
    total["units"] += sale.units
    total["revenue"] += sale.revenue
    return total


def merge_totals(category: str, a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    return {"units": a["units"] + b["units"], "revenue": a["revenue"] + b["revenue"]}


def pipelines(context: Context) -> Topology:
    topology = Topology("sales")
    catalogue = topology.global_table(PRODUCTS, PRODUCT, key="sku")
    events = topology.source(ITEM_EVENTS, ITEM_EVENT, key="store_id", timestamp="ts")
    (
        events.filter(is_sale)
        .join(catalogue, categorized, how="left", key=sku_of, name="categorize")
        .group_by(category_of, name="by_category")
        .window_by(Tumbling(HOUR))
        .aggregate(SALES_BY_CATEGORY, no_sales, add_sale, merge=merge_totals)
    )
    return topology
