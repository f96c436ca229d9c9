"""Random records for the nightly job's tests, fed to a TestDriver: the demo pipelines'
(the chaos load's shape: late sales, payments in and out of their window, catalogue
changes), the page views of tests/support/pipelines.py and the clicks of
tests/support/graces.py."""

from __future__ import annotations

import random

from chaos.workload import Workload, product_records
from streams.testing import TestDriver
from tests.support.graces import CLICKS
from tests.support.pipelines import BROKEN_PAGE, USERS, VIEWS

MINUTE_MS = 60_000
DEMO_MODULES = ("agents.words", "agents.inventory", "agents.sales", "agents.settling")


def demo_records(driver: TestDriver, seed: int, start_ms: int, steps: int = 120) -> None:
    """Text lines, item events, payments and the catalogue, 15 s of event time a step,
    the driver run every few steps (so its batches are not the job's)."""
    load = Workload(seed, f"s{seed}")
    for key, value, ts in product_records(start_ms):
        driver.produce("products", value, key=key, timestamp=ts)
    clock = start_ms
    for step in range(steps):
        clock += 15_000
        for r in load.next_lines(30):
            driver.produce("text-lines", r.value, timestamp=clock)
        for r in load.next_events(40, clock):
            driver.produce("item-events", r.value, key=r.key, timestamp=clock)
        for r in load.due_payments(clock):
            driver.produce("payments", r.value, key=r.key, timestamp=clock)
        if step % 29 == 0:
            driver.run()
    driver.produce("text-lines", b"\xff\xfe not UTF-8", timestamp=clock)
    driver.produce(
        "item-events", b'{"event_id": "x", "kind": "sale"}', key="store-01", timestamp=clock
    )
    driver.run()


def page_view_records(driver: TestDriver, seed: int, start_ms: int, views: int = 3000) -> None:
    """Users (some change country partway) and page views over an hour, a few of them
    late by up to 8 minutes (some beyond the hopping windows' grace), a few of a page
    whose processing raises."""
    rng = random.Random(seed)
    users = [f"u{n}" for n in range(25)]
    countries = ["fr", "de", "jp", "br"]
    for user in users[:20]:
        country = rng.choice(countries)
        driver.produce(
            USERS, {"user": user, "country": country}, key=user, timestamp=start_ms - MINUTE_MS
        )
    for user in users[:5]:
        changed = {"user": user, "country": rng.choice(countries)}
        driver.produce(USERS, changed, key=user, timestamp=start_ms + 30 * MINUTE_MS)
    pages = ["/", "/cart", "/help", "/search", BROKEN_PAGE]
    clock = start_ms
    for n in range(views):
        clock += rng.randint(0, 2400)
        late = rng.random() < 0.03
        ts = clock - rng.randint(MINUTE_MS, 8 * MINUTE_MS) if late else clock
        user = rng.choice(users)
        page = BROKEN_PAGE if n % 97 == 5 else rng.choice(pages[:4])
        view = {"user": user, "page": page, "ms": rng.randint(100, 90_000), "ts": ts}
        driver.produce(VIEWS, view, key=user, timestamp=clock)
        if n % 400 == 399:
            driver.run()
    driver.produce(VIEWS, {"user": "u1", "page": "/"}, key="u1", timestamp=clock)  # no ts
    driver.produce(VIEWS, {"user": "u2", "page": "/", "ms": 1, "ts": clock}, key="u3")
    driver.run()


def click_records(driver: TestDriver, seed: int, start_ms: int, clicks: int = 600) -> None:
    """Users' clicks over about an hour, one in ten behind its partition by up to 12
    minutes (some within the windows' graces, some beyond), the driver run every hundred
    clicks (so its batches are not the job's)."""
    rng = random.Random(seed)
    users = [f"u{n}" for n in range(12)]
    clock = start_ms
    for n in range(clicks):
        clock += rng.randint(0, 5000)
        behind = rng.randint(0, 12 * MINUTE_MS) if rng.random() < 0.1 else 0
        user = rng.choice(users)
        driver.produce(CLICKS, {"user": user, "ts": clock - behind}, key=user, timestamp=clock)
        if n % 100 == 99:
            driver.run()
    driver.run()
