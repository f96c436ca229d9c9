"""/topics: write records to a source topic, validated as the stream validates them."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Coroutine
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Path, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.models import Example
from fastapi.responses import Response
from fastapi.routing import APIRoute
from prometheus_client import Counter

from api.bodies import BodyProblem, json_body, parsed
from api.deps import UNAUTHORIZED, Worker, authorize, require_token
from api.errors import InvalidRecords, KafkaUnavailable, NotFound, PayloadTooLarge, QueryError
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
                try:
                    body, scope = await json_body(request)
                    return await parsed(handler, scope, body)
                except BodyProblem as problem:
                    raise invalid([(None, str(problem))]) from None
            except RequestValidationError as error:
                max_bytes = request.app.state.worker.settings.max_event_bytes
                refusal = as_refusal(error, body, inputs[topic], max_bytes)
                REFUSED.labels(label, REASONS[refusal.status]).inc()
                raise refusal from None
            except QueryError as error:
                REFUSED.labels(label, REASONS.get(error.status, "kafka-unavailable")).inc()
                raise

        return bounded


def check_topic(topic: str, inputs: Inputs) -> None:
    if topic not in inputs:
        raise NotFound(f"{topic[:80]!r} is not a source topic: {', '.join(sorted(inputs))}")


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
listing = APIRouter(
    prefix="/topics", tags=["topics"], dependencies=[Depends(require_token)], responses=UNAUTHORIZED
)


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
    408: {"model": ErrorDetail, "description": "the body did not arrive within 10 s"},
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
        "were written all the same), or the worker has no live connection to any broker "
        "(nothing was written); retry after Retry-After seconds",
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
    if worker.membership.broker_connected() is False:
        # /ready says so too: no need to wait out the acknowledgement's timeout, and
        # nothing is handed to the producer that could be written later behind a 503.
        raise KafkaUnavailable(
            f"no live connection to any Kafka broker of {worker.settings.bootstrap_servers}; "
            "nothing was written"
        )
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
