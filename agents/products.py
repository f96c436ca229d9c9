"""products: validate catalogue records; invalid ones go to products-dlq.

The catalogue itself (tables/catalog.py) is kept by every worker from the whole topic;
this pipeline, one task per partition across the group, is where a bad record is
reported, once.
"""

from __future__ import annotations

import functools

from core.semantics import InvalidEvent, check_key, parse_product
from core.topics import PRODUCTS, dlq_topic
from tables.pipeline import Batch, Context, Pipeline


def validate_products(batch: Batch, *, max_bytes: int) -> None:
    for record in batch.of(PRODUCTS):
        if record.value is None:
            continue  # a tombstone deletes the product from the catalogue
        try:
            product = parse_product(record.value, max_bytes)
            check_key(record.key, product.sku, "sku")
        except InvalidEvent as error:
            batch.dead_letter(record, error.reason)


def pipelines(context: Context) -> list[Pipeline]:
    return [
        Pipeline(
            name="products.validate",
            reads=(PRODUCTS,),
            produces=(dlq_topic(PRODUCTS),),
            process=functools.partial(validate_products, max_bytes=context.max_event_bytes),
        )
    ]
