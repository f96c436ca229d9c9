"""Which requests the lean key-read path leaves to the FastAPI app, and its token check."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from api.fastpath import KeyReads, _authorized


def test_the_token_check_accepts_only_the_exact_bearer_token() -> None:
    assert _authorized(None, None)
    assert _authorized("", b"Bearer anything")
    assert _authorized("s3cret", b"Bearer s3cret")
    assert _authorized("s3cret", b"bearer s3cret")
    assert not _authorized("s3cret", None)
    assert not _authorized("s3cret", b"Bearer wrong")
    assert not _authorized("s3cret", b"Bearer  s3cret")  # FastAPI's HTTPBearer refuses it too
    assert not _authorized("s3cret", b"Basic s3cret")
    assert not _authorized("s3cret", b"Bearer")


class Inner:
    """Stands for the FastAPI app: records what reached it."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        self.state = SimpleNamespace(
            queries=SimpleNamespace(
                tables={
                    "word_counts": SimpleNamespace(kind="table"),
                    "sales_by_category": SimpleNamespace(kind="windowed"),
                }
            ),
            worker=SimpleNamespace(settings=SimpleNamespace(api_token="t")),
        )

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.paths.append(scope["path"])


def scope(path: str, method: str = "GET", query: bytes = b"", token: bytes | None = None) -> Any:
    headers = [] if token is None else [(b"authorization", b"Bearer " + token)]
    return {
        "type": "http",
        "method": method,
        "path": path,
        "query_string": query,
        "headers": headers,
    }


@pytest.mark.parametrize(
    "request_scope",
    [
        scope("/health"),
        scope("/tables"),
        scope("/tables/word_counts/keys"),
        scope("/tables/word_counts/keys/", token=b"t"),
        scope("/tables/word_counts/keys/x", method="POST", token=b"t"),
        scope("/tables/word_counts/keys/x", query=b"at=1", token=b"t"),
        scope("/tables/sales_by_category/keys/books", token=b"t"),
        scope("/tables/nope/keys/x", token=b"t"),
        scope("/tables/a/b/keys/x", token=b"t"),
        scope("/tables/word_counts/keys/x"),  # no token: FastAPI answers 401
        scope("/tables/word_counts/keys/x", token=b"wrong"),
        scope("/tables/word_counts/keys/" + "k" * 1025, token=b"t"),
    ],
)
def test_everything_but_a_plain_key_read_reaches_the_fastapi_app(request_scope: Any) -> None:
    inner = Inner()

    async def send(message: Any) -> None:
        raise AssertionError(f"the lean path answered {request_scope['path']}: {message}")

    asyncio.run(KeyReads(inner)(request_scope, None, send))
    assert inner.paths == [request_scope["path"]]
