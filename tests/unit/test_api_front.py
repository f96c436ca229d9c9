"""The worker's front app: /health and /ready before FastAPI is imported, every other
request held until the FastAPI app is attached (or refused with Retry-After), and the
core's start and stop from the server's lifespan."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import orjson
from fastapi.testclient import TestClient

from api.app import create_api
from api.core import ApiCore
from api.front import FrontApp
from core.settings import Settings
from tables.engine import TP
from tests.support.api import FixedMembership, worker_view
from tests.support.clock import Clock
from tests.unit.test_health import stalled_engine


def http(path: str) -> dict[str, Any]:
    return {"type": "http", "method": "GET", "path": path, "query_string": b"", "headers": []}


async def call(app: Any, scope: dict[str, Any]) -> tuple[int, dict[str, str], Any]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    headers = {k.decode(): v.decode() for k, v in start["headers"]}
    return start["status"], headers, orjson.loads(body)


def worker(clock: Clock, assigned: bool = True) -> Any:
    engine, _ = stalled_engine(clock)
    actives = frozenset({TP("streamstate-t-changelog", 0)}) if assigned else frozenset()
    membership = FixedMembership(actives=actives)
    return replace(worker_view(Settings(broker_url="127.0.0.1:9"), engine, membership), inputs={})


def test_ready_and_health_answer_as_the_fastapi_app_does_before_it_is_attached(
    clock: Clock,
) -> None:
    for assigned in (True, False):
        view = worker(clock, assigned)
        core = ApiCore(view)
        front = FrontApp(core)
        status, headers, body = asyncio.run(call(front, http("/ready")))
        full = TestClient(create_api(view, core)).get("/ready")
        assert (status, body) == (full.status_code, full.json())
        assert headers.get("retry-after") == full.headers.get("retry-after")
        assert asyncio.run(call(front, http("/health")))[::2] == (200, {"status": "ok"})
    assert status == 503  # no assignment
    assert body["status"] == "recovering"


def test_another_route_waits_for_the_fastapi_app_and_is_answered_by_it(clock: Clock) -> None:
    view = worker(clock)
    core = ApiCore(view)
    front = FrontApp(core, wait_s=5.0)
    full = create_api(view, core)

    async def go() -> tuple[int, dict[str, str], Any]:
        pending = asyncio.ensure_future(call(front, http("/tables")))
        await asyncio.sleep(0.05)
        assert not pending.done()  # held, not refused
        front.attach(full)
        return await asyncio.wait_for(pending, 5.0)

    status, _, body = asyncio.run(go())
    expected = TestClient(full).get("/tables")
    assert expected.status_code == 200
    assert (status, body) == (200, expected.json())


def test_another_route_is_refused_with_retry_after_when_the_app_does_not_come(
    clock: Clock,
) -> None:
    front = FrontApp(ApiCore(worker(clock)), wait_s=0.05)
    status, headers, body = asyncio.run(call(front, http("/tables")))
    assert status == 503
    assert headers["retry-after"] == "1"
    assert "starting" in body["detail"]


def test_the_lifespan_starts_and_stops_the_core() -> None:
    events: list[str] = []

    async def start() -> None:
        events.append("start")

    async def stop() -> None:
        events.append("stop")

    core: Any = SimpleNamespace(start=start, stop=stop, queries=None, worker=None)
    messages = iter([{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}])
    sent: list[str] = []

    async def receive() -> dict[str, str]:
        return next(messages)

    async def send(message: dict[str, str]) -> None:
        sent.append(message["type"])

    asyncio.run(FrontApp(core)({"type": "lifespan"}, receive, send))
    assert events == ["start", "stop"]
    assert sent == ["lifespan.startup.complete", "lifespan.shutdown.complete"]
