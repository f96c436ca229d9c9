"""The console (/ui) in Debian's chromium, driven by Playwright, against two real workers on
a real broker with the demo generator running and an added pipeline: each view paints the
group's live figures within a second, updates at least every 2 s, logs no console error
and asks no host but the worker; a dead letter replayed after a fix is applied once, and
a second replay is refused.

``STREAMSTATE_SCREENSHOTS=DIR`` (``make screenshots``) also writes a PNG of each view there.
"""

from __future__ import annotations

import itertools
import json
import os
import statistics
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
from playwright.sync_api import Browser, ConsoleMessage, Page, Playwright, sync_playwright

from tests.support.browser import OFFLINE_FLAGS, chromium
from tests.support.kafka import ROOT, TEST_PORT, LocalKafka, local_kafka
from tests.support.kafka_io import produce, read_topic, wait_for
from tests.support.ports import require_free_port
from tests.support.workers import Worker, stop_workers

pytestmark = pytest.mark.integration
T = TypeVar("T")

TOKEN = "console-test-token"
GENERATOR = [str(ROOT / ".venv/bin/python"), "-m", "ops.generator"]
VIEWS = ("topology", "group", "tables", "dead-letters", "nightly")
SCREENSHOTS = os.environ.get("STREAMSTATE_SCREENSHOTS")

#: A pipeline added as a user adds one; it refuses amounts written as text until the fix
#: (DEPOSITS_ACCEPT_TEXT=1) is deployed.
DEPOSITS = '''
"""Account balances: the sum of each account's deposits."""

import os

import orjson

from tables.pipeline import Batch, Context, Pipeline, TableSpec

ACCEPT_TEXT = os.environ.get("DEPOSITS_ACCEPT_TEXT") == "1"


def apply_deposits(batch: Batch) -> None:
    balances = batch.table("balances")
    for record in batch.of("deposits"):
        amount = orjson.loads(record.value)["amount"]
        if ACCEPT_TEXT and isinstance(amount, str) and amount.isdigit():
            amount = int(amount)
        if not isinstance(amount, int):
            raise TypeError(f"amount {amount!r} is not a whole number")
        balances.put(record.key, (balances.get(record.key) or 0) + amount)


def pipelines(context: Context) -> list[Pipeline]:
    return [
        Pipeline(
            name="balances",
            reads=("deposits",),
            writes=(TableSpec("balances", queryable=True),),
            process=apply_deposits,
        )
    ]
'''


@dataclass
class Cluster:
    kafka: LocalKafka
    workers: list[Worker]
    nightly: Path

    @property
    def url(self) -> str:
        return self.workers[0].url

    def api(self, path: str, body: Any = None, worker: int = 0) -> tuple[int, Any]:
        """A request to a worker's API with the token: (status, decoded JSON)."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.workers[worker].url + path,
            data=data,
            method="POST" if data is not None else "GET",
            headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=20) as answer:
                return answer.status, json.loads(answer.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read())


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    chromium()  # fails now, saying how to install it, rather than after the workers start
    require_free_port(TEST_PORT)
    base = tmp_path_factory.mktemp("console")
    (base / "deposits_pipeline.py").write_text(DEPOSITS)
    nightly = base / "nightly"
    env = {
        "STREAMSTATE_API_TOKEN": TOKEN,
        "STREAMSTATE_EXTRA_PIPELINES": "deposits_pipeline",
        "PYTHONPATH": str(base),
        "STREAMSTATE_NIGHTLY_REPORTS": str(nightly),
    }
    with local_kafka("console") as kafka:
        workers = [Worker(kafka, base / f"w{n}", extra_env=dict(env)) for n in range(2)]
        generator = None
        try:
            for worker in workers:
                worker.start()
            for worker in workers:
                worker.wait_ready()
            generator = subprocess.Popen(
                [*GENERATOR, "--bootstrap", kafka.bootstrap, "--rate", "20"],
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            yield Cluster(kafka, workers, nightly)
        finally:
            if generator is not None:
                generator.terminate()
                generator.wait(10)
            stop_workers(workers)


@dataclass
class Watch:
    """What the pages of one browser did: requests, console errors, page errors."""

    requests: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def attach(self, page: Page) -> Page:
        page.on("request", lambda request: self.requests.append(request.url))
        page.on("console", self._console)
        page.on("pageerror", lambda error: self.errors.append(f"page error: {error}"))
        return page

    def _console(self, message: ConsoleMessage) -> None:
        if message.type in ("error", "warning"):
            self.errors.append(f"{message.type}: {message.text} ({message.location})")


@pytest.fixture(scope="module")
def playwright() -> Iterator[Playwright]:
    with sync_playwright() as running:
        yield running


@pytest.fixture(scope="module")
def browser(playwright: Playwright) -> Iterator[Browser]:
    launched = playwright.chromium.launch(executable_path=chromium(), args=OFFLINE_FLAGS)
    try:
        yield launched
    finally:
        launched.close()


@pytest.fixture
def watch() -> Watch:
    return Watch()


def open_view(browser: Browser, watch: Watch, cluster: Cluster, view: str) -> Page:
    """A fresh page of ``view``, its token in the tab's sessionStorage as the token form
    leaves it."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    context.add_init_script(f"sessionStorage.setItem('streamstate.console.token', '{TOKEN}')")
    page = watch.attach(context.new_page())
    page.goto(f"{cluster.url}/ui/#/{view}")
    return page


def wait_true(page: Page, expression: str, timeout_s: float = 15.0) -> None:
    """Until ``expression`` is true in the page. (Playwright's wait_for_function evaluates
    its predicate with eval, which the console's Content Security Policy forbids.)"""
    deadline = time.monotonic() + timeout_s
    while not page.evaluate(f"() => Boolean({expression})"):
        assert time.monotonic() < deadline, f"never true: {expression}"
        page.wait_for_timeout(50)


def first_paint_ms(page: Page, view: str) -> float:
    """Milliseconds from the navigation's start until the view showed the worker's figures."""
    wait_true(page, f"performance.getEntriesByName('streamstate:{view}').length > 0")
    found: float = page.evaluate(f"performance.getEntriesByName('streamstate:{view}')[0].startTime")
    return found


def asked_before_the_modules_ran(page: Page, view: str) -> bool:
    """Whether the view's first data request started before DOMContentLoaded, which waits
    for the page's modules: the page asks for the opening view's data itself."""
    path = {"dead-letters": None}.get(view, view)
    if path is None:  # its first request depends on the view's state
        return True
    started: float | None = page.evaluate(
        f"""() => performance.getEntriesByType('resource')
              .find((e) => new URL(e.name).pathname === '/{path}')?.startTime ?? null"""
    )
    loaded: float = page.evaluate(
        "performance.getEntriesByType('navigation')[0].domContentLoadedEventStart"
    )
    assert started is not None, f"no request for /{path}"
    if view == "tables":  # and the first table's first page of keys, at once, taken over
        keys: list[float] = page.evaluate(
            """() => performance.getEntriesByType('resource')
                  .filter((e) => /^\\/tables\\/[^/]+\\/keys$/.test(new URL(e.name).pathname))
                  .map((e) => e.startTime)"""
        )
        painted = first_paint_ms(page, view)
        assert len([at for at in keys if at < painted]) == 1, keys
        return max(started, keys[0]) < loaded
    return started < loaded


def update_gaps(page: Page, seconds: float = 6.0) -> list[float]:
    """Seconds between the view's successive updates over ``seconds``."""
    page.evaluate(
        """() => {
          window.__updates = [];
          const view = document.querySelector('section.view');
          new MutationObserver(() => window.__updates.push(performance.now()))
            .observe(view, {attributes: true, attributeFilter: ['data-updated']});
        }"""
    )
    page.wait_for_timeout(seconds * 1000)
    stamps: list[float] = page.evaluate("window.__updates")
    assert len(stamps) >= 2, f"the view updated {len(stamps)} times in {seconds} s"
    return [(b - a) / 1000 for a, b in itertools.pairwise(stamps)]


def screenshot(page: Page, view: str) -> None:
    if SCREENSHOTS:
        Path(SCREENSHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(SCREENSHOTS) / f"console-{view}.png"), full_page=True)


def only_the_worker(watch: Watch, cluster: Cluster) -> None:
    others = [u for u in watch.requests if not u.startswith(f"{cluster.url}/")]
    assert others == [], f"requests to other hosts: {others}"
    assert any("/ui/assets/vendor/preact/" in u for u in watch.requests)
    assert watch.errors == [], watch.errors


def test_the_token_form_opens_the_console_and_keeps_the_token_for_the_tab(
    browser: Browser, cluster: Cluster, watch: Watch
) -> None:
    page = watch.attach(browser.new_page())
    page.goto(f"{cluster.url}/ui")
    page.get_by_label("Token").fill(TOKEN)
    page.get_by_role("button", name="Open the console").click()
    page.wait_for_selector("svg.topology .node", timeout=15_000)
    page.reload()
    page.wait_for_selector("svg.topology .node", timeout=15_000)  # no form again
    assert page.evaluate("sessionStorage.getItem('streamstate.console.token')") == TOKEN
    only_the_worker(watch, cluster)
    page.context.close()


@pytest.mark.alone  # timed: with the machine to itself
@pytest.mark.parametrize("view", VIEWS)
def test_each_view_updates_at_least_every_two_seconds_and_reports_its_first_paint(
    browser: Browser, cluster: Cluster, watch: Watch, view: str
) -> None:
    # The first paint (target: under 1 s) is measured and reported, not asserted: on a
    # machine shared with other loads it measures the machine (docs/console.md).
    paints = []
    for _ in range(3):
        page = open_view(browser, watch, cluster, view)
        paints.append(first_paint_ms(page, view))
        assert asked_before_the_modules_ran(page, view)
        page.context.close()
    page = open_view(browser, watch, cluster, view)
    first_paint_ms(page, view)
    gaps = update_gaps(page)
    print(
        f"{view}: first paint {[round(p) for p in paints]} ms "
        f"(median {statistics.median(paints):.0f}); updates {[round(g, 2) for g in gaps]} s apart"
    )
    assert max(gaps) <= 2.0, gaps
    only_the_worker(watch, cluster)
    page.context.close()


def test_the_topology_shows_every_pipeline_with_live_rates_and_lag(
    browser: Browser, cluster: Cluster, watch: Watch
) -> None:
    page = open_view(browser, watch, cluster, "topology")
    page.wait_for_selector("svg.topology .node", timeout=15_000)
    for node in ("topic:text-lines", "topic:deposits", "step:balances", "table:balances"):
        assert page.locator(f'g.node[data-id="{node}"]').count() == 1, node
    assert page.locator('g.node.dead-letter[data-id="topic:deposits-dlq"]').count() == 1
    # The word count's first step (a declared pipeline is drawn step by step).
    flowing = 'g.edge[data-from="topic:text-lines"][data-to^="step:"]'
    wait_true(page, f"Number(document.querySelector('{flowing}')?.dataset.rate) > 0")
    shown = page.locator(f"{flowing} text.rate").text_content() or ""
    assert shown.endswith("/s")
    status, topology = cluster.api("/topology")
    assert status == 200
    assert topology["members"] == 2
    lag = next(n for n in topology["nodes"] if n["id"] == "topic:text-lines")["lag_records"]
    assert isinstance(lag, int)
    screenshot(page, "topology")
    only_the_worker(watch, cluster)
    page.context.close()


def test_the_group_shows_both_members_their_partitions_and_lag(
    browser: Browser, cluster: Cluster, watch: Watch
) -> None:
    page = open_view(browser, watch, cluster, "group")
    for worker in cluster.workers:
        row = page.locator(f'tr[data-member="{worker.url}"]')
        row.wait_for(timeout=15_000)
        assert "running" in row.inner_text()
    status, group = cluster.api("/group")
    assert status == 200
    held = {
        (table, p, m["url"], side)
        for m in group["members"]
        for side in ("active", "standby")
        for table, parts in m[side].items()
        for p in parts
    }
    actives = {(t, p) for t, p, _, side in held if side == "active"}
    assert {(t, p) for t, p in actives if t == "balances"} == {("balances", p) for p in range(8)}
    cell = page.locator('td.cell[data-table="balances"][data-partition="3"]')
    owner = next(u for t, p, u, side in held if (t, p, side) == ("balances", 3, "active"))
    letter = "AB"[sorted(w.url for w in cluster.workers).index(owner)]
    assert cell.locator("span.active").inner_text() == letter
    assert cell.locator("span.standby").inner_text() == ("B" if letter == "A" else "A").lower()
    lagging = page.locator('table.sources td.cell[data-topic="text-lines"]')
    assert lagging.count() == 8
    page.locator(".chart canvas").first.wait_for(timeout=15_000)
    screenshot(page, "group")
    only_the_worker(watch, cluster)
    page.context.close()


def test_tables_look_up_a_key_page_through_keys_follow_a_key_and_chart_windows(
    browser: Browser, cluster: Cluster, watch: Watch
) -> None:
    page = open_view(browser, watch, cluster, "tables")
    page.locator("table.keys tbody tr").first.wait_for(timeout=15_000)
    page.get_by_label("Table").select_option("word_counts")
    page.get_by_label("Key", exact=True).fill("fox")
    page.get_by_role("button", name="Look up").click()
    shown = page.locator('pre.value[data-key="fox"]')
    shown.wait_for(timeout=15_000)
    status, answer = cluster.api("/tables/word_counts/keys/fox")
    assert status == 200
    assert int(shown.inner_text()) > 0
    assert answer["served_by"] in page.locator(".lookup dl.answer").inner_text()
    page.get_by_role("button", name="Follow live").click()
    line = {"records": [{"key": None, "value": "fox"}]}
    status, _ = cluster.api("/topics/text-lines/records", line)
    assert status == 200
    wait_true(page, "Number(document.querySelector('.follow')?.dataset.events) >= 2", 20)
    page.get_by_role("button", name="Next").click()
    page.wait_for_selector("text=page 2")
    page.get_by_label("Table").select_option("sales_by_category")
    category = page.locator("table.keys a.key").first
    category.wait_for(timeout=15_000)
    category.click()
    wait_true(page, "Number(document.querySelector('.windows')?.dataset.windows) > 0", 20)
    page.locator(".windows .chart canvas").wait_for(timeout=15_000)
    screenshot(page, "tables")
    only_the_worker(watch, cluster)
    page.context.close()


def write_report(nightly: Path) -> None:
    """A report as the nightly job writes it (jobs.recompute's shape, its own writer)."""
    from jobs.io import write_report as job_writes

    run_dir = nightly / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    run_dir.mkdir(parents=True)
    entry = {"missing_in_stream": 0, "missing_in_batch": 1, "examples": []}
    report = {
        "cut": {"text-lines": {"0": 10}},
        "cut_taken_at_ms": int(time.time() * 1000) - 60_000,
        "cut_settled": True,
        "seconds": 37.25,
        "corrections_published": 2,
        "tables": {
            "word_counts": {"keys_compared": 1234, "mismatched": 0, **entry},
            "inventory": {
                "keys_compared": 12,
                "mismatched": 1,
                **entry,
                "corrections_published": 2,
            },
        },
    }
    job_writes(run_dir, report)


def test_the_nightly_view_shows_the_last_report(
    browser: Browser, cluster: Cluster, watch: Watch
) -> None:
    page = open_view(browser, watch, cluster, "nightly")
    page.wait_for_selector("text=no report.json", timeout=15_000)
    write_report(cluster.nightly)
    row = page.locator('table.nightly tr[data-table="inventory"]')
    row.wait_for(timeout=10_000)  # without a reload
    cells = [c.strip() for c in row.locator("td").all_inner_texts()]
    assert cells[:7] == ["inventory", "12", "2", "1", "0", "1", "2"]
    assert "37.3 s" in page.locator("dl.answer").inner_text()
    screenshot(page, "nightly")
    only_the_worker(watch, cluster)
    page.context.close()


def off_loop(call: Callable[..., T], *args: Any) -> T:
    """``call(*args)`` in a thread of its own: the Kafka helpers run an event loop, and
    Playwright's sync API has one running in this thread."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(call, *args).result()


def balance(cluster: Cluster, account: str) -> Any:
    status, body = cluster.api(f"/tables/balances/keys/{account}")
    return body["value"] if status == 200 else status


def test_a_dead_letter_replayed_after_the_fix_is_applied_once(
    browser: Browser, cluster: Cluster, watch: Watch
) -> None:
    bootstrap = cluster.kafka.bootstrap
    off_loop(produce, bootstrap, "deposits", [(b"acct-7", {"amount": 5})])
    wait_for(lambda: balance(cluster, "acct-7") == 5, 30)
    off_loop(produce, bootstrap, "deposits", [(b"acct-7", {"amount": "40"})])
    off_loop(produce, bootstrap, "item-events", [(b"store-001", b"not an event")])
    [dead] = wait_for(lambda: off_loop(read_topic, bootstrap, "deposits-dlq") or None, 30)
    assert dead.headers["error"].startswith(b"processing failed: TypeError")
    [bad] = wait_for(lambda: off_loop(read_topic, bootstrap, "item-events-dlq") or None, 30)
    name = f"deposits-dlq/{dead.partition}/{dead.offset}"
    invalid = f"item-events-dlq/{bad.partition}/{bad.offset}"

    # The fix is deployed: every worker restarts with it.
    stop_workers(cluster.workers)
    for worker in cluster.workers:
        worker.extra_env["DEPOSITS_ACCEPT_TEXT"] = "1"
        worker.start()
    for worker in cluster.workers:
        worker.wait_ready()
    assert balance(cluster, "acct-7") == 5

    page = open_view(browser, watch, cluster, "dead-letters")
    for record in (name, invalid):
        page.locator(f'tr[data-record="{record}"]').wait_for(timeout=20_000)
        page.get_by_label(f"select {record}").check()
    page.get_by_role("button", name="Replay 2 selected").click()
    done = page.locator('[data-outcome="done"]')
    done.wait_for(timeout=20_000)
    assert f"{name}: replayed to deposits[{dead.partition}]" in done.inner_text()
    assert f"{invalid}: dead-lettered to item-events-dlq" in done.inner_text()
    wait_for(lambda: balance(cluster, "acct-7") == 45, 30)
    page.locator(f'tr[data-record="{name}"] .badge', has_text="replayed").wait_for()
    assert page.get_by_label(f"select {name}").is_disabled()
    screenshot(page, "dead-letters")
    only_the_worker(watch, cluster)
    page.context.close()

    # Once only: a second replay, through the other worker, is refused and changes nothing.
    coordinates = {"topic": "deposits-dlq", "partition": dead.partition, "offset": dead.offset}
    status, refused = cluster.api("/dead-letters/replay", {"records": [coordinates]}, worker=1)
    assert status == 409, refused
    assert refused["refused"][0]["replay"]["status"] == "replayed"
    replayed = [r for r in off_loop(read_topic, bootstrap, "deposits") if r.key == b"acct-7"]
    assert [r.headers.get("replayed-from") for r in replayed] == [None, None, name.encode()]
    again = off_loop(read_topic, bootstrap, "item-events-dlq")
    assert [r.headers.get("replayed-from") for r in again] == [None, invalid.encode()]
    assert again[1].headers["error"].startswith(b"replay refused: ")
    time.sleep(3)
    assert balance(cluster, "acct-7") == 45
