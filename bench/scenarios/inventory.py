"""Inventory: store events through one project worker (stock per store, the sales feed
into sales_by_category and the settling join), measured from committed offsets."""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path

from bench import data
from bench.config import Sizes
from bench.kafka import BenchKafka, create_project_topics, produce
from bench.procs import Worker
from bench.progress import watch_group
from bench.scenarios import Outcome
from bench.stats import instant_rates, steady_rate

ITEM_EVENTS = "item-events"
SALES_REPARTITION = "streamstate-sales_by_category-repartition"


def run(kafka: BenchKafka, sizes: Sizes, work: Path) -> Outcome:
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    events = sizes.inventory_events
    started = time.monotonic()
    asyncio.run(create_project_topics(kafka.bootstrap))
    asyncio.run(produce(kafka.bootstrap, "products", data.product_records(data.catalogue())))
    asyncio.run(produce(kafka.bootstrap, ITEM_EVENTS, data.item_events(events)))
    preload_s = time.monotonic() - started
    worker = Worker(kafka.broker_url, work / "project", env={"TABLE_STANDBY_REPLICAS": "0"})
    worker.start()
    try:
        progress = asyncio.run(
            watch_group(
                kafka.bootstrap,
                "streamstate",
                ITEM_EVENTS,
                [SALES_REPARTITION],
                events,
                sizes.inventory_max_s,
                alive=worker.alive,
            )
        )
    finally:
        worker.stop()
    notes = [
        f"{events:,} store events (80% sales) over 1,000 stores preloaded in {preload_s:.0f} s; "
        "rate from committed offsets of item-events and the sales repartition topic."
    ]
    if not progress.finished:
        notes.append(
            f"Not finished in {sizes.inventory_max_s:.0f} s: {progress.done:,.0f} of "
            f"{events:,} events processed; the rate is over that window. At the end it had "
            f"committed {progress.committed.get(ITEM_EVENTS, 0):,} store events and "
            f"{progress.committed.get(SALES_REPARTITION, 0):,} of "
            f"{progress.ends.get(SALES_REPARTITION, 0):,} sales repartition records."
        )
    return Outcome(
        figures={"events_per_s": steady_rate(progress.series)},
        notes=notes,
        details={
            "events": events,
            "finished": progress.finished,
            "series": progress.series,
            "rates": instant_rates(progress.series),
        },
    )
