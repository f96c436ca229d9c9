"""A key's change stream is told from the key ``.../changes`` by the path as sent, where
only an unescaped ``/`` separates segments: by the FastAPI routes and the lean key-read
path alike."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from api.fastpath import KeyRead, KeyReads
from api.paths import names_changes, raw_path
from tests.support.api import make_api

READ = "/tables/{table}/keys/{key:path}"
CHANGES = READ + "/changes"
METADATA = "/metadata/tables/{table}/keys/{key:path}"


@pytest.mark.parametrize(
    ("raw", "stream"),
    [
        (b"/tables/t/keys/x/changes", True),
        (b"/tables/t/keys/x/chang%65s", True),  # an escaped letter is the letter
        (b"/tables/t/keys/x%2Fchanges/changes", True),
        (b"/tables/t/keys/x%2Fchanges", False),
        (b"/tables/t/keys/x%2fchanges", False),
        (b"/tables/t/keys/changes", True),  # the route's pattern wants a key before it
        (b"/tables/t/keys/x/changes/", False),
        (b"/tables/t/keys/x/changes%2F", False),
        (b"/tables/t/keys/xchanges", False),
    ],
)
def test_only_a_last_segment_changes_names_a_stream(raw: bytes, stream: bool) -> None:
    assert names_changes(raw) is stream


def test_the_raw_path_is_the_decoded_one_when_the_server_gives_none() -> None:
    assert raw_path({"path": "/a/é", "raw_path": b"/a/%C3%A9"}) == b"/a/%C3%A9"
    assert raw_path({"path": "/a/é"}) == "/a/é".encode()


def http(path: str, raw: bytes) -> dict[str, Any]:
    return {
        "type": "http",
        "method": "GET",
        "path": path,
        "raw_path": raw,
        "query_string": b"",
        "headers": [],
        "http_version": "1.1",
        "scheme": "http",
        "server": ("127.0.0.1", 6066),
        "client": ("127.0.0.1", 50000),
        "root_path": "",
    }


def route_of(path: str, raw: bytes) -> tuple[str, str]:
    """The route template the FastAPI app took for a GET, and the key it read."""
    scope = http(path, raw)

    async def receive() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        pass

    asyncio.run(make_api()(scope, receive, send))
    return scope["route"].path, scope["path_params"]["key"]


@pytest.mark.parametrize(
    ("path", "raw", "route", "key"),
    [
        ("/tables/t/keys/x/changes", b"/tables/t/keys/x%2Fchanges", READ, "x/changes"),
        ("/tables/t/keys/x/changes", b"/tables/t/keys/x/changes", CHANGES, "x"),
        ("/tables/t/keys/changes", b"/tables/t/keys/changes", READ, "changes"),
        ("/tables/t/keys/x/changes/changes", b"/tables/t/keys/x%2Fchanges/changes", CHANGES,
         "x/changes"),
        ("/tables/t/keys/changes/changes", b"/tables/t/keys/changes/changes", CHANGES, "changes"),
        ("/metadata/tables/t/keys/x/changes", b"/metadata/tables/t/keys/x%2Fchanges", METADATA,
         "x/changes"),
    ],
)  # fmt: skip
def test_the_fastapi_app_routes_by_the_path_as_sent(
    path: str, raw: bytes, route: str, key: str
) -> None:
    assert route_of(path, raw) == (route, key)


class Tables:
    """What the lean path reads of the worker's query layer."""

    def __init__(self) -> None:
        self.tables = {"t": SimpleNamespace(name="t", kind="table")}
        self.state = SimpleNamespace(
            queries=self, worker=SimpleNamespace(settings=SimpleNamespace(api_token=None))
        )

    def query(self, table: Any, key: str, *_: Any) -> Any:
        return SimpleNamespace(table=table, key=key)


@pytest.mark.parametrize(
    ("path", "raw", "key"),
    [
        ("/tables/t/keys/x/changes", b"/tables/t/keys/x%2Fchanges", "x/changes"),
        ("/tables/t/keys/changes", b"/tables/t/keys/changes", "changes"),
        ("/tables/t/keys/x/changes", b"/tables/t/keys/x/changes", None),  # FastAPI's
        ("/tables/t/keys/x/changes/changes", b"/tables/t/keys/x%2Fchanges/changes", None),
    ],
)
def test_the_lean_path_reads_the_keys_the_fastapi_app_reads(
    path: str, raw: bytes, key: str | None
) -> None:
    request = KeyReads(Tables()).lean_request(path, raw, b"", [])
    if key is None:
        assert request is None
    else:
        assert isinstance(request, KeyRead)
        assert request.query.key == key
