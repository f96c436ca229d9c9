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
        scope("/tables/word_counts/keys/" + "é" * 600, token=b"t"),  # 1,200 bytes
        # a peer's batch of reads, when the lean path cannot answer it
        scope("/internal/reads/word_counts", query=b"key=a&key=b"),  # no token
        scope("/internal/reads/word_counts", query=b"key=a", token=b"wrong"),
        scope("/internal/reads/word_counts", token=b"t"),  # no key
        scope("/internal/reads/word_counts", query=b"key=a&at=1", token=b"t"),
        scope("/internal/reads/word_counts", query=b"key=a&&", token=b"t"),
        scope("/internal/reads/word_counts", query=b"&".join([b"key=k"] * 65), token=b"t"),
        scope("/internal/reads/sales_by_category", query=b"key=books", token=b"t"),
        scope("/internal/reads/nope", query=b"key=a", token=b"t"),
        scope("/internal/reads/word_counts/x", query=b"key=a", token=b"t"),
    ],
)
def test_everything_but_a_plain_key_read_reaches_the_fastapi_app(request_scope: Any) -> None:
    inner = Inner()

    async def send(message: Any) -> None:
        raise AssertionError(f"the lean path answered {request_scope['path']}: {message}")

    asyncio.run(KeyReads(inner)(request_scope, None, send))
    assert inner.paths == [request_scope["path"]]


async def _plain_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]}
    )
    await send({"type": "http.response.body", "body": b"ok"})


async def _exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bytes:
    writer.write(b"GET /x HTTP/1.1\r\nHost: t\r\n\r\n")
    await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    return head + await asyncio.wait_for(reader.readexactly(2), 5)


def test_the_protocol_closes_a_connection_idle_for_the_keep_alive_timeout_only() -> None:
    """A real uvicorn server on loopback with the worker's protocol: a connection used
    within the timeout stays open past it; one idle for the timeout is closed."""
    import uvicorn

    from api.fastpath import KeyReadProtocol

    async def scenario() -> tuple[bool, float]:
        config = uvicorn.Config(
            _plain_app,
            host="127.0.0.1",
            port=0,
            http=KeyReadProtocol,
            timeout_keep_alive=1,
            lifespan="off",
            log_level="warning",
        )
        server = uvicorn.Server(config)
        serving = asyncio.ensure_future(server.serve())
        for _ in range(500):  # uvicorn says it started by a flag only
            if server.started:
                break
            await asyncio.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            for _ in range(4):  # 1.6 s of use, a request every 0.4 s: never idle 1 s
                assert (await _exchange(reader, writer)).endswith(b"ok")
                await asyncio.sleep(0.4)
            still_open = not reader.at_eof()
            assert (await _exchange(reader, writer)).endswith(b"ok")
            idle_from = asyncio.get_running_loop().time()
            assert await asyncio.wait_for(reader.read(1), 5) == b""  # closed by the server
            return still_open, asyncio.get_running_loop().time() - idle_from
        finally:
            writer.close()
            server.should_exit = True
            await serving

    still_open, closed_after = asyncio.run(scenario())
    assert still_open
    assert 0.9 <= closed_after < 2.5, closed_after
