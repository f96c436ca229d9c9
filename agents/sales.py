"""sales_by_category: tumbling 1-hour windows on event time, per category."""

from __future__ import annotations

from typing import Any

import faust
from faust import StreamT

from app.semantics import add_sale


def register(app: faust.App, source: Any, sales_by_category: Any) -> None:
    """Declare the agent that folds re-keyed sales into their windows."""

    @app.agent(source, name="sales.count_sales")
    async def count_sales(stream: StreamT[dict[str, Any]]) -> None:
        async for event in stream.events():
            category = event.key.decode("utf-8")
            sale = event.value
            window = sales_by_category[category]
            sales_by_category[category] = add_sale(
                window.current(), int(sale["units"]), float(sale["revenue"])
            )
