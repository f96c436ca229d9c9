"""/docs and /redoc name no other host, and their assets come from the worker itself."""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient

from api.docs import ASSETS, ASSETS_URL
from tests.support.api import make_api

CLIENT = TestClient(make_api())


def urls(html: str) -> list[str]:
    return re.findall(r'(?:src|href)="([^"]*)"', html)


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_a_docs_page_loads_everything_from_the_worker(page: str) -> None:
    answer = CLIENT.get(page)
    assert answer.status_code == 200
    found = urls(answer.text)
    assert found, answer.text
    assert all(url.startswith(ASSETS_URL + "/") for url in found), found
    assert "googleapis" not in answer.text
    assert "'/openapi.json'" in answer.text or '"/openapi.json"' in answer.text


@pytest.mark.parametrize("page", ["/docs", "/redoc", "/docs/oauth2-redirect"])
def test_a_docs_page_may_load_nothing_from_another_host(page: str) -> None:
    policy = CLIENT.get(page).headers["content-security-policy"]
    directives = dict(d.split(" ", 1) for d in policy.split("; "))
    assert directives["default-src"] == "'none'"
    for kind in ("script-src", "style-src", "img-src", "connect-src", "font-src"):
        sources = directives[kind].split()
        assert "'self'" in sources
        assert not [s for s in sources if "." in s or s in ("*", "https:", "http:")], sources


def test_swagger_ui_asks_no_online_validator() -> None:
    assert '"validatorUrl": null' in CLIENT.get("/docs").text


@pytest.mark.parametrize(
    ("name", "media_type"),
    [
        ("swagger-ui-bundle.js", "javascript"),
        ("swagger-ui.css", "text/css"),
        ("redoc.standalone.js", "javascript"),
        ("favicon.png", "image/png"),
    ],
)
def test_the_assets_are_served(name: str, media_type: str) -> None:
    assert name in ASSETS
    answer = CLIENT.get(f"{ASSETS_URL}/{name}")
    assert answer.status_code == 200
    assert media_type in answer.headers["content-type"]
    assert len(answer.content) > 500


def test_the_oauth2_redirect_page_is_served() -> None:
    assert CLIENT.get("/docs/oauth2-redirect").status_code == 200


def test_the_docs_pages_stay_out_of_the_openapi_document() -> None:
    paths = CLIENT.get("/openapi.json").json()["paths"]
    assert "/docs" not in paths
    assert "/redoc" not in paths
    assert "/tables/{table}/keys/{key}" in paths


def test_every_route_behind_the_token_documents_its_401() -> None:
    """What a client without the token gets is in the OpenAPI document of every route
    that asks for it: each path that answers 401 without it says so."""
    client = TestClient(make_api(token="s3cret"))
    document = client.get("/openapi.json").json()
    missing = []
    for path, methods in document["paths"].items():
        for method, operation in methods.items():
            concrete = path.replace("{table}", "word_counts").replace("{key}", "k")
            concrete = concrete.replace("{topic}", "text-lines")
            status = client.request(method.upper(), concrete).status_code
            if status == 401 and "401" not in operation["responses"]:
                missing.append(f"{method.upper()} {path}")
    assert missing == []
    assert "401" in document["paths"]["/tables"]["get"]["responses"]  # one the test reached


@pytest.mark.parametrize(
    ("path", "unknown", "takes"),
    [
        ("/tables?max_lag_record=0", "'max_lag_record'", "none"),
        ("/tables/t/keys?limt=5", "'limt'", "cursor, limit, prefix"),
        ("/metadata?x=1&y=2", "'x', 'y'", "none"),
        ("/dead-letters?topc=a", "'topc'", "limit, topic"),
    ],
)
def test_a_query_parameter_the_route_does_not_take_is_a_400_naming_it(
    path: str, unknown: str, takes: str
) -> None:
    answer = CLIENT.get(path)
    assert answer.status_code == 400, answer.text
    assert (
        answer.json()["detail"] == f"unknown query parameter {unknown}; this route takes: {takes}"
    )


def test_a_peers_forwarded_request_may_carry_parameters_this_worker_does_not_know() -> None:
    from api.peers import FORWARDED_HEADER

    answer = CLIENT.get("/tables?newer=1", headers={FORWARDED_HEADER: "http://127.0.0.1:6067"})
    assert answer.status_code == 200, answer.text


def test_a_routes_query_names_are_never_those_of_another_route_that_had_its_id() -> None:
    from fastapi.routing import APIRoute

    from api import deps

    async def plain() -> None:
        return None

    async def paged(limit: int = 1, topic: str = "") -> None:
        return None

    route, other = APIRoute("/plain", plain), APIRoute("/paged", paged)
    assert deps._query_names(other) == frozenset({"limit", "topic"})
    # as if a route of an app dropped since had held this route's id
    deps._QUERY_NAMES[id(route)] = (other, frozenset({"limit", "topic"}))
    assert deps._query_names(route) == frozenset()
