"""products: validate catalogue records; invalid ones go to products-dlq.

The catalogue itself (tables/catalog.py) is kept by every worker from the whole topic;
this agent, one per partition across the group, is where a bad record is reported, once.
"""

from __future__ import annotations

from typing import Any

import faust
from faust import StreamT

from agents.dlq import DeadLetters
from app.semantics import InvalidEvent, check_key, parse_product
from app.settings import Settings


def register(app: faust.App, settings: Settings, source: Any, dlq: DeadLetters) -> None:
    """Declare the products validation agent."""

    @app.agent(source, name="products.validate")
    async def validate_products(stream: StreamT[bytes]) -> None:
        async for event in stream.events():
            if event.value is None:
                continue  # a tombstone deletes the product from the catalogue
            try:
                product = parse_product(event.value, settings.max_event_bytes)
                check_key(event.key, product.sku, "sku")
            except InvalidEvent as error:
                await dlq.send(event, error.reason)
