"""/topics: write records to a source topic, validated as the stream validates them."""

from __future__ import annotations

import asyncio
import json
import time
import zlib
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Path, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.models import Example
from fastapi.responses import Response
from fastapi.routing import APIRoute
from prometheus_client import Counter
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from api.deps import Worker, authorize, require_token
from api.errors import (
    InvalidRecords,
    NotFound,
    PayloadTooLarge,
    QueryError,
    RequestTimeout,
    UnsupportedMediaType,
)
from api.metrics import REGISTRY
from api.producer import RecordProducer
from api.records import prepare
from api.schemas import (
    ErrorDetail,
    InvalidRecordsDetail,
    Produced,
    ProduceRequest,
    RecordOffset,
    TopicDescription,
    TopicList,
)
from api.tokens import Token, encode_token
from tables.pipeline import SourceSpec

#: Largest request body, in bytes.
MAX_BODY_BYTES = 1024 * 1024
#: Most records in one request.
MAX_RECORDS = 1000

PRODUCED = Counter(
    "streamstate_produced_records",
    "Records written through POST /topics/{topic}/records, by topic.",
    ["topic"],
    registry=REGISTRY,
)
REFUSED = Counter(
    "streamstate_produce_refusals",
    "Writes refused by POST /topics/{topic}/records, by topic (other: not a source topic) "
    "and reason: invalid (422), too-large (413), unsupported-media-type (415), "
    "unknown-topic (404), unauthorized (401), timeout (408), kafka-unavailable (503).",
    ["topic", "reason"],
    registry=REGISTRY,
)
REASONS = {
    401: "unauthorized",
    404: "unknown-topic",
    408: "timeout",
    413: "too-large",
    415: "unsupported-media-type",
    422: "invalid",
}

#: The topics records may be written to, each with its declared type (None: any value).
Inputs = dict[str, SourceSpec | None]


#: What a refused body may still send, and how long it may take, before the answer: a
#: client that sends a whole body before it reads the answer (most do) then reads the 413
#: instead of a connection reset by a server that stopped reading.
DRAIN_BYTES = 16 * MAX_BODY_BYTES
#: How long a body of at most MAX_BODY_BYTES may take to arrive.
BODY_TIMEOUT_S = 10.0
DRAIN_IDLE_S = 0.2
DRAIN_TOTAL_S = 2.0


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


#: The body encodings the route reads (Content-Encoding), each by how zlib reads it.
ENCODINGS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


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


def decoded_body(request: Request, body: bytes, limit: int = MAX_BODY_BYTES) -> bytes:
    """The body with its Content-Encoding undone (gzip or deflate), at most ``limit`` bytes
    once inflated; an encoding the route does not read is a 415."""
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
        raise InvalidRecords(
            "invalid body; nothing was written", [(None, f"body: not {encoding}: {exc}")]
        ) from None
    if len(found) > limit:
        raise PayloadTooLarge(f"body of more than {limit} bytes once inflated")
    if not inflate.eof:
        raise InvalidRecords(
            "invalid body; nothing was written", [(None, f"body: {encoding} data cut short")]
        )
    return found


def check_text(body: bytes) -> None:
    """JSON is UTF-8: a body that is not gets a 422 that names the first bad byte (the
    JSON parser would answer a bare 400)."""
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidRecords(
            "invalid body; nothing was written",
            [(None, f"body: not UTF-8: byte 0x{body[exc.start]:02x} at {exc.start}, {exc.reason}")],
        ) from None


def unparsed(error: HTTPException) -> QueryError:
    """FastAPI's bare 400 for a body its JSON parser raised on (other than a syntax
    error, which is a 422 already) as this route's 422 naming the cause."""
    cause = error.__cause__
    if isinstance(cause, RecursionError):
        reason = "body: JSON nested too deeply to be read"
    else:
        reason = f"body: not readable as JSON ({type(cause).__name__ if cause else error.detail})"
    return InvalidRecords("invalid body; nothing was written", [(None, reason)])


def as_refusal(
    error: RequestValidationError, body: bytes, spec: SourceSpec | None, max_bytes: int
) -> QueryError:
    """FastAPI's body validation errors as this route's answers: 413 for too many
    records; else 422 naming the body's problem, or every bad record's index and reason
    (all records are checked, not only those FastAPI refused)."""
    problems: list[tuple[int | None, str]] = []
    for item in error.errors():
        loc = [str(part) for part in item["loc"]]
        if item["type"] == "json_invalid":
            where = f" at character {loc[1]}" if len(loc) > 1 else ""
            problems.append((None, f"body: not JSON: {item.get('ctx', {}).get('error')}{where}"))
            continue
        if loc == ["body", "records"] and item["type"] == "too_long":
            return PayloadTooLarge(f"more than {MAX_RECORDS} records; at most {MAX_RECORDS}")
        if loc[:2] != ["body", "records"] or len(loc) < 3 or not loc[2].isdigit():
            problems.append((None, f"{'.'.join(loc)}: {item['msg']}"))
    if problems:
        return invalid(problems)
    # Only records are wrong, so the body is a JSON object with a list of records.
    _, found = prepare(spec, json.loads(body)["records"], max_bytes)
    return invalid(list(found))


class ProduceRoute(APIRoute):
    """Checks the token and the topic, and reads the body within its limit, before
    FastAPI parses it; gives body validation errors this route's shape; counts refusals."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def bounded(request: Request) -> Response:
            topic = request.path_params.get("topic", "")
            inputs: Inputs = request.app.state.inputs
            label = topic if topic in inputs else "other"
            try:
                await authorize(request)
                check_topic(topic, inputs)
                body = await read_bounded(request)
                found = media_type(request)
                check_media_type(found)
                body = decoded_body(request, body)
                check_text(body)
                scope = request.scope
                if found is None:  # read as JSON: FastAPI parses a body only with a type
                    scope = {**scope, "headers": [*scope["headers"], JSON_TYPE]}
                try:
                    return await handler(Request(scope, _replay(body)))
                except HTTPException as error:
                    if error.status_code != 400:
                        raise
                    raise unparsed(error) from None
            except RequestValidationError as error:
                max_bytes = request.app.state.worker.settings.max_event_bytes
                refusal = as_refusal(error, body, inputs[topic], max_bytes)
                REFUSED.labels(label, REASONS[refusal.status]).inc()
                raise refusal from None
            except QueryError as error:
                REFUSED.labels(label, REASONS.get(error.status, "kafka-unavailable")).inc()
                raise

        return bounded


JSON_TYPE = (b"content-type", b"application/json")


def check_topic(topic: str, inputs: Inputs) -> None:
    if topic not in inputs:
        raise NotFound(f"{topic[:80]!r} is not a source topic: {', '.join(sorted(inputs))}")


def _replay(body: bytes) -> Callable[[], Coroutine[Any, Any, dict[str, Any]]]:
    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    return receive


def invalid(problems: list[tuple[int | None, str]]) -> InvalidRecords:
    records = sum(1 for index, _ in problems if index is not None)
    what = f"{records} invalid record{'s' if records != 1 else ''}" if records else "invalid body"
    return InvalidRecords(f"{what}; nothing was written", problems)


router = APIRouter(
    prefix="/topics",
    tags=["topics"],
    dependencies=[Depends(require_token)],
    route_class=ProduceRoute,
)
listing = APIRouter(prefix="/topics", tags=["topics"], dependencies=[Depends(require_token)])


@listing.get("", response_model=TopicList, summary="The topics records may be written to")
async def topics(request: Request) -> TopicList:
    """Every topic the pipelines read that no pipeline writes, with the type its records
    are checked with, the field its key must equal, and whether a null value deletes."""
    inputs: Inputs = request.app.state.inputs
    return TopicList(
        topics=[
            TopicDescription(
                name=name,
                value_type=spec.value.name if spec is not None else "bytes",
                key_field=spec.key if spec is not None else None,
                timestamp_field=spec.timestamp if spec is not None else None,
                tombstones=bool(spec is not None and spec.tombstones),
            )
            for name, spec in sorted(inputs.items())
        ]
    )


EXAMPLES = {
    "text": Example(
        summary="a topic of text values (any key, or none)",
        value={"records": [{"key": None, "value": "the quick brown fox"}]},
    ),
    "json": Example(
        summary="a topic of JSON objects keyed by one of their fields (a null key becomes it)",
        value={
            "records": [
                {"key": None, "value": {"user": "alice", "page": "/home", "ts": 1764000000000}}
            ]
        },
    ),
}

ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorDetail, "description": "missing or wrong bearer token"},
    404: {"model": ErrorDetail, "description": "not one of the source topics"},
    413: {"model": ErrorDetail, "description": "body over 1 MiB, or over 1,000 records"},
    415: {
        "model": ErrorDetail,
        "description": "a Content-Type other than JSON, or a Content-Encoding other than "
        "gzip or deflate",
    },
    422: {
        "model": InvalidRecordsDetail,
        "description": "some records are invalid: each one's index and reason; nothing was written",
    },
    503: {
        "model": ErrorDetail,
        "description": "Kafka did not acknowledge the records (the detail says how many "
        "were written all the same); retry after Retry-After seconds",
        "headers": {
            "Retry-After": {"description": "seconds to wait", "schema": {"type": "integer"}}
        },
    },
}


@router.post(
    "/{topic}/records",
    response_model=Produced,
    responses=ERRORS,
    summary="Write records to a source topic",
)
async def produce(
    topic: Annotated[str, Path(description="A topic the pipelines read (GET /topics lists them).")],
    body: Annotated[ProduceRequest, Body(openapi_examples=EXAMPLES)],
    request: Request,
    worker: Worker,
) -> Produced:
    """Write records to a source topic, all or none, with acks=all.

    The body is JSON (``Content-Type: application/json``, or no type at all), as it is or
    compressed (``Content-Encoding: gzip`` or ``deflate``), at most 1 MiB once inflated.

    Every record is first validated as the stream validates what it reads (the topic's
    schema, the event size limit, the key rules); if any is invalid, nothing is written.
    The answer gives each record's partition and offset, and a token naming the written
    positions.
    """
    inputs: Inputs = request.app.state.inputs
    check_topic(topic, inputs)
    ready, problems = prepare(inputs[topic], body.records, worker.settings.max_event_bytes)
    if problems:
        raise invalid(list(problems))
    producer: RecordProducer = request.app.state.producer
    placed = await producer.send(topic, ready)
    PRODUCED.labels(topic).inc(len(placed))
    positions: dict[int, int] = {}
    for partition, offset in placed:
        positions[partition] = max(positions.get(partition, 0), offset + 1)
    ends = getattr(request.app.state, "ends", None)
    if ends is not None:  # bounded reads here count these records at once
        ends.written(topic, positions, time.monotonic())
    return Produced(
        topic=topic,
        offsets=[RecordOffset(partition=p, offset=o) for p, o in placed],
        token=encode_token(Token(topic, positions), worker.membership.app_id),
    )
