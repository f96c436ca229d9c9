"""Request bodies of the routes that take JSON: read within a limit and a time, in a
type the route reads (JSON, or no type at all) and an encoding it reads (none, gzip or
deflate), and every way a JSON parser can fail named in the answer.

:func:`json_body` reads and checks a body before FastAPI parses it; :func:`parsed` runs
a route's handler over it and names what FastAPI's parser raised on. The produce route
(api/routes/topics.py) and :class:`JsonBodyRoute` (the other routes with a JSON body)
both read their bodies so.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

from fastapi import Request
from fastapi.responses import Response
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.types import Scope

from api.deps import authorize
from api.errors import PayloadTooLarge, QueryError, RequestTimeout, UnsupportedMediaType

#: Largest request body, in bytes (once inflated).
MAX_BODY_BYTES = 1024 * 1024
#: What a refused body may still send, and how long it may take, before the answer: a
#: client that sends a whole body before it reads the answer (most do) then reads the 413
#: instead of a connection reset by a server that stopped reading.
DRAIN_BYTES = 16 * MAX_BODY_BYTES
#: How long a body of at most MAX_BODY_BYTES may take to arrive.
BODY_TIMEOUT_S = 10.0
DRAIN_IDLE_S = 0.2
DRAIN_TOTAL_S = 2.0
#: The body encodings read (Content-Encoding), each by how zlib reads it.
ENCODINGS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
JSON_TYPE = (b"content-type", b"application/json")

Handler = Callable[[Request], Coroutine[Any, Any, Response]]


class BodyProblem(ValueError):
    """A body that is not JSON a parser can read: why, as the answer says it."""


async def read_bounded(request: Request, limit: int = MAX_BODY_BYTES) -> bytes:
    """The request body, or PayloadTooLarge as soon as it is known to exceed ``limit``:
    from Content-Length before reading anything, else while it streams in. What the
    client goes on sending of a refused body is read and dropped first (within bounds)."""
    declared = request.headers.get("content-length", "")
    stream = request.stream().__aiter__()
    if declared.isdigit() and int(declared) > limit:
        if int(declared) <= DRAIN_BYTES:
            await _drain(stream)
        raise PayloadTooLarge(f"body of {declared} bytes; at most {limit}")
    chunks, size = [], 0
    try:
        async with asyncio.timeout(BODY_TIMEOUT_S):
            async for chunk in stream:
                size += len(chunk)
                if size > limit:
                    await _drain(stream)
                    raise PayloadTooLarge(f"body of more than {limit} bytes")
                chunks.append(chunk)
    except TimeoutError:
        raise RequestTimeout(
            f"the body did not arrive within {BODY_TIMEOUT_S:g} s ({size} bytes came)"
        ) from None
    except ClientDisconnect:  # nobody is left to answer: nothing was written
        raise RequestTimeout("the client closed the connection before its body arrived") from None
    return b"".join(chunks)


async def _drain(stream: AsyncIterator[bytes]) -> None:
    """Read and drop what arrives of a refused body: up to DRAIN_BYTES in DRAIN_TOTAL_S,
    and no longer than DRAIN_IDLE_S after the client last sent something."""
    loop = asyncio.get_running_loop()
    deadline, dropped = loop.time() + DRAIN_TOTAL_S, 0
    while dropped <= DRAIN_BYTES:
        wait = min(DRAIN_IDLE_S, deadline - loop.time())
        if wait <= 0:
            return
        try:
            dropped += len(await asyncio.wait_for(anext(stream), wait))
        except (StopAsyncIteration, TimeoutError, ClientDisconnect):
            return


def media_type(request: Request) -> str | None:
    """The body's media type, lower case without parameters; None when not given."""
    declared = request.headers.get("content-type")
    if declared is None:
        return None
    return declared.split(";", 1)[0].strip().lower() or None


def check_media_type(found: str | None) -> None:
    """JSON only: ``application/json`` or an ``application/...+json`` type. A body sent
    without a type is read as JSON (as many clients send one); a form or text body gets a
    415 that says what to send instead of the 422 a JSON parser would give it."""
    json = found == "application/json" or (
        found is not None and found.startswith("application/") and found.endswith("+json")
    )
    if found is not None and not json:
        raise UnsupportedMediaType(
            f"Content-Type {found!r}: the body must be JSON (Content-Type: application/json)"
        )


def inflated(request: Request, body: bytes, limit: int = MAX_BODY_BYTES) -> bytes:
    """The body with its Content-Encoding undone (gzip or deflate), at most ``limit`` bytes
    once inflated; an encoding not read here is a 415."""
    encoding = request.headers.get("content-encoding", "").strip().lower()
    if encoding in ("", "identity"):
        return body
    wbits = ENCODINGS.get(encoding)
    if wbits is None:
        raise UnsupportedMediaType(
            f"Content-Encoding {encoding[:40]!r}: the body must be sent as it is, or with "
            "gzip or deflate"
        )
    inflate = zlib.decompressobj(wbits)
    try:
        found = inflate.decompress(body, limit + 1)
    except zlib.error as exc:
        raise BodyProblem(f"body: not {encoding}: {exc}") from None
    if len(found) > limit:
        raise PayloadTooLarge(f"body of more than {limit} bytes once inflated")
    if not inflate.eof:
        raise BodyProblem(f"body: {encoding} data cut short")
    return found


def check_text(body: bytes) -> None:
    """JSON is UTF-8: a body that is not is named by its first bad byte (the JSON parser
    would answer a bare 400)."""
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as exc:
        bad = body[exc.start]
        raise BodyProblem(
            f"body: not UTF-8: byte 0x{bad:02x} at {exc.start}, {exc.reason}"
        ) from None


async def json_body(request: Request, limit: int = MAX_BODY_BYTES) -> tuple[bytes, Scope]:
    """The request's body, read and checked (see the module's docstring), and the scope
    to hand it to FastAPI with: a body sent without a type is given the JSON type, which
    FastAPI needs to parse it. Raises :class:`QueryError` (413, 408, 415) or
    :class:`BodyProblem`."""
    body = await read_bounded(request, limit)
    found = media_type(request)
    check_media_type(found)
    body = inflated(request, body, limit)
    check_text(body)
    scope = request.scope
    if found is None:
        scope = {**scope, "headers": [*scope["headers"], JSON_TYPE]}
    return body, scope


async def parsed(handler: Handler, scope: Scope, body: bytes) -> Response:
    """``handler`` over a body read by :func:`json_body`. FastAPI answers a bare 400 for
    a body its JSON parser raised on other than with a syntax error (which is a 422
    already): that is a :class:`BodyProblem` naming the cause."""
    try:
        return await handler(Request(scope, replayed(body)))
    except HTTPException as error:
        if error.status_code != 400:
            raise
        cause = error.__cause__
        if isinstance(cause, RecursionError):
            raise BodyProblem("body: JSON nested too deeply to be read") from None
        what = type(cause).__name__ if cause is not None else error.detail
        raise BodyProblem(f"body: not readable as JSON ({what})") from None


def replayed(body: bytes) -> Callable[[], Coroutine[Any, Any, dict[str, Any]]]:
    """An ASGI ``receive`` that hands over ``body``, read already."""

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    return receive


class InvalidBody(QueryError):
    """A body that is not JSON a parser can read (the routes besides produce)."""

    status = 422


class JsonBodyRoute(APIRoute):
    """A route whose JSON body is read as :func:`json_body` reads it: within its limit
    and time, as JSON whatever its type says unless the type is another (415), inflated,
    and a body no parser can read answered with a 422 that says why."""

    def get_route_handler(self) -> Handler:
        handler = super().get_route_handler()

        async def checked(request: Request) -> Response:
            await authorize(request)  # the token first: nothing is read without it
            try:
                body, scope = await json_body(request)
                return await parsed(handler, scope, body)
            except BodyProblem as problem:
                raise InvalidBody(str(problem)) from None

        return checked
