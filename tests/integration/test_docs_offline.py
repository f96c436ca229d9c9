"""/docs and /redoc of a running worker, opened in headless Chromium that can resolve no
host but 127.0.0.1 (a machine without internet access): the pages render the API's
routes, and every request they make goes to the worker itself (the pages' Content
Security Policy blocks anything else before it is sent)."""

from __future__ import annotations

import html
import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.support.browser import OFFLINE_FLAGS, chromium
from tests.support.kafka import TEST_PORT, local_kafka
from tests.support.ports import require_free_port
from tests.support.workers import Worker

pytestmark = pytest.mark.integration

ROUTES = ["/tables/{table}/keys/{key}", "/tables/{table}/keys", "/topics/{topic}/records"]


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Worker]:
    chromium()  # fails now, saying how to install it, rather than after the worker starts
    require_free_port(TEST_PORT)
    with local_kafka("docs") as kafka:
        running = Worker(kafka, tmp_path_factory.mktemp("docs") / "w0").start()
        try:
            running.wait_ready()  # /health answers 200 from the process's first moment
            yield running
        finally:
            running.stop()


def open_offline(url: str, scratch: Path) -> tuple[str, list[str]]:
    """The rendered DOM of ``url`` and the URLs the page requested, in a browser that
    resolves no host but 127.0.0.1."""
    net_log = scratch / "net-log.json"
    command = [
        chromium(),
        "--headless",
        *OFFLINE_FLAGS,
        f"--user-data-dir={scratch / 'profile'}",
        f"--log-net-log={net_log}",
        "--virtual-time-budget=30000",
        "--dump-dom",
        url,
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout, page_requests(net_log, url)


def page_requests(net_log: Path, url: str) -> list[str]:
    """The URLs the page loaded, and every URL it asked for: requests started by the page's
    origin, leaving out the browser's own background traffic."""
    text = net_log.read_text()
    try:
        log: dict[str, Any] = json.loads(text)
    except ValueError:  # a net log may lack its closing brackets
        log = json.loads(text.rstrip().rstrip(",") + "]}")
    start_job = log["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"]
    parts = urlsplit(url)
    origin = f"{parts.scheme}://{parts.netloc}"
    jobs = [e["params"] for e in log["events"] if e["type"] == start_job and "params" in e]
    return [
        job["url"]
        for job in jobs
        if job.get("initiator") == origin or job.get("request_type") == "main frame"
    ]


def visible_text(dom: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", dom))


@pytest.mark.parametrize(
    ("page", "script"),
    [
        ("/docs", "/docs/assets/swagger-ui-bundle.js"),
        ("/redoc", "/docs/assets/redoc.standalone.js"),
    ],
)
def test_the_docs_page_shows_the_routes_without_internet(
    worker: Worker, tmp_path: Path, page: str, script: str
) -> None:
    dom, requested = open_offline(worker.url + page, tmp_path)
    text = visible_text(dom)
    for route in ROUTES:
        assert route in text, f"{page} does not show {route}"
    origin = f"http://127.0.0.1:{worker.port}"
    assert worker.url + script in requested
    assert worker.url + "/openapi.json" in requested
    assert [u for u in requested if not u.startswith(origin + "/")] == []
