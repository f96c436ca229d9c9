"""POST /topics/{topic}/records without a broker: validation by the stream's rules, all or
nothing, limits, the token rule, refusals in /metrics, and a real producer that finds no
Kafka (503)."""

from __future__ import annotations

import gzip
import json
import socket
import zlib
from collections.abc import Iterator, Sequence
from typing import Any

import orjson
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from hypothesis import example, given, settings
from hypothesis import strategies as st

from agents.schemas import SOURCE_TOPICS, ItemEvent
from api.bodies import MAX_BODY_BYTES
from api.metrics import REGISTRY
from api.records import Outgoing
from api.tokens import Token, decode_token
from core.topics import partition_for
from core.values import InvalidEvent, check_key, parse_model
from tests.support import api as support
from tests.support.api import APP_ID

TOKEN = "s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
NOW = 1_764_000_000_000


def sale(store: str = "store-1", **changes: Any) -> dict[str, Any]:
    event = {"event_id": "e-1", "store_id": store, "sku": "sku-1", "kind": "sale",
             "quantity": 2, "unit_price": 3.5, "ts": NOW}  # fmt: skip
    return {**event, **changes}


def payment(store: str = "store-1") -> dict[str, Any]:
    return {"payment_id": "p-1", "sale_event_id": "e-1", "store_id": store,
            "amount": 7.0, "ts": NOW}  # fmt: skip


def product(sku: str = "sku-1") -> dict[str, Any]:
    return {"sku": sku, "name": "oat milk", "category": "dairy"}


class FakeProducer:
    """Stands for the Kafka producer: places records as Kafka's partitioner would."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, list[Outgoing]]] = []
        self.ends: dict[int, int] = {}

    async def send(self, topic: str, records: Sequence[Outgoing]) -> list[tuple[int, int]]:
        self.sent.append((topic, list(records)))
        placed = []
        for record in records:
            partition = 5 if record.key is None else partition_for(record.key, 8)
            offset = self.ends.get(partition, 100)
            self.ends[partition] = offset + 1
            placed.append((partition, offset))
        return placed

    async def stop(self) -> None:
        pass


def make_api(token: str | None = TOKEN, **settings: Any) -> FastAPI:
    return support.make_api(token, **settings)


@pytest.fixture
def producer() -> FakeProducer:
    return FakeProducer()


@pytest.fixture
def client(producer: FakeProducer) -> TestClient:
    api = make_api()
    api.state.producer = producer
    return TestClient(api, headers=AUTH)


def post(client: TestClient, topic: str, records: list[dict[str, Any]]) -> Any:
    return client.post(f"/topics/{topic}/records", json={"records": records})


def errors(answer: Any) -> dict[int | None, str]:
    assert answer.status_code == 422, answer.text
    return {e["index"]: e["reason"] for e in answer.json()["errors"]}


# -- accepted ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("topic", "record", "key"),
    [
        ("text-lines", {"key": None, "value": "the quick brown fox"}, None),
        ("text-lines", {"key": "any key", "value": "über café"}, b"any key"),
        ("item-events", {"key": None, "value": sale()}, b"store-1"),
        ("item-events", {"key": "store-1", "value": sale()}, b"store-1"),
        ("payments", {"key": None, "value": payment("store-9")}, b"store-9"),
        ("products", {"key": None, "value": product("sku-4")}, b"sku-4"),
    ],
)
def test_a_valid_record_is_produced_with_its_key(
    client: TestClient, producer: FakeProducer, topic: str, record: dict[str, Any], key: Any
) -> None:
    answer = post(client, topic, [record])
    assert answer.status_code == 200, answer.text
    [(sent_topic, [outgoing])] = producer.sent
    assert sent_topic == topic
    assert outgoing.key == key
    value = record["value"]
    if topic == "text-lines":
        assert outgoing.value == value.encode()
    else:
        assert orjson.loads(outgoing.value or b"") == value


def test_the_answer_gives_each_records_offset_in_order_and_a_token(
    client: TestClient, producer: FakeProducer
) -> None:
    stores = ["store-1", "store-2", "store-1", "store-3", "store-2"]
    answer = post(client, "item-events", [{"key": None, "value": sale(s)} for s in stores])
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["topic"] == "item-events"
    partitions = [partition_for(s.encode(), 8) for s in stores]
    assert [o["partition"] for o in body["offsets"]] == partitions
    last: dict[int, int] = {}
    for place in body["offsets"]:
        last[place["partition"]] = max(last.get(place["partition"], 0), place["offset"] + 1)
    assert decode_token(body["token"], APP_ID, topics=SOURCE_TOPICS) == Token("item-events", last)


def test_a_product_tombstone_needs_its_key(client: TestClient, producer: FakeProducer) -> None:
    assert post(client, "products", [{"key": "sku-1", "value": None}]).status_code == 200
    assert producer.sent == [("products", [Outgoing(b"sku-1", None)])]
    assert (
        "needs its sku as key"
        in errors(post(client, "products", [{"key": None, "value": None}]))[0]
    )


def test_a_json_value_is_produced_compact_and_as_given(
    client: TestClient, producer: FakeProducer
) -> None:
    post(
        client, "products", [{"key": None, "value": {"sku": "s", "name": "crème", "category": "c"}}]
    )
    [(_, [outgoing])] = producer.sent
    assert outgoing.value == '{"sku":"s","name":"crème","category":"c"}'.encode()


# -- refused by the stream's rules ---------------------------------------------------------


def test_a_key_that_differs_from_the_store_id_is_refused(client: TestClient) -> None:
    found = errors(post(client, "item-events", [{"key": "store-2", "value": sale("store-1")}]))
    assert found == {0: "key: 'store-2' does not match store_id 'store-1'"}


def test_a_key_that_differs_from_the_sku_is_refused(client: TestClient) -> None:
    found = errors(post(client, "products", [{"key": "sku-2", "value": product("sku-1")}]))
    assert found == {0: "key: 'sku-2' does not match sku 'sku-1'"}


def test_a_text_line_is_a_string(client: TestClient) -> None:
    found = errors(post(client, "text-lines", [{"key": None, "value": {"line": "x"}}]))
    assert found == {0: "value: a text value is a JSON string, not an object"}


def test_an_event_over_the_size_limit_is_refused_as_the_stream_would() -> None:
    api = make_api(max_event_bytes=100)
    api.state.producer = FakeProducer()
    client = TestClient(api, headers=AUTH)
    found = errors(post(client, "text-lines", [{"key": None, "value": "x" * 101}]))
    assert found == {0: "value: 101 bytes exceeds the limit of 100"}
    assert post(client, "text-lines", [{"key": None, "value": "x" * 100}]).status_code == 200


def test_every_bad_record_is_named_and_nothing_is_produced(
    client: TestClient, producer: FakeProducer
) -> None:
    records = [
        {"key": None, "value": sale()},
        {"key": None, "value": sale(kind="sale", unit_price=None)},
        {"key": None, "value": sale(quantity=0)},
        {"key": 7, "value": sale()},
        {"value": sale(), "partition": 3},
        {"key": None, "value": sale(ts="yesterday")},
        {"key": None, "value": sale()},
    ]
    found = errors(post(client, "item-events", records))
    assert sorted(found) == [1, 2, 3, 4, 5]
    assert "unit_price is required for a sale" in found[1]
    assert "quantity must be > 0 for sale" in found[2]
    assert found[3] == "key: Input should be a valid string"
    assert found[4] == "partition: Extra inputs are not permitted"
    assert found[5].startswith("ts: ")
    assert producer.sent == []


def test_the_answer_counts_the_bad_records(client: TestClient) -> None:
    answer = post(client, "text-lines", [{"key": None, "value": 1}, {"key": None, "value": 2}])
    assert answer.json()["detail"] == "2 invalid records; nothing was written"


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ('{"records": [{"key": null, "value": "\\ud800"}]}', "value: not UTF-8"),
        ('{"records": [{"key": "\\udfff", "value": "line"}]}', "key: not UTF-8"),
        ('{"records": [{"key": null, "value": NaN}]}', "value: a text value is a JSON string"),
    ],
)
def test_text_that_is_not_utf8_is_refused(client: TestClient, body: str, reason: str) -> None:
    answer = client.post("/topics/text-lines/records", content=body, headers=JSON)
    assert errors(answer)[0].startswith(reason)


def test_nan_is_not_json(client: TestClient) -> None:
    body = orjson.dumps({"records": [{"key": None, "value": sale()}]}).replace(b"3.5", b"NaN")
    answer = client.post("/topics/item-events/records", content=body, headers=JSON)
    assert errors(answer) == {0: "value: NaN and Infinity are not JSON numbers"}


JSON = {"content-type": "application/json"}


@pytest.mark.parametrize(
    "body",
    [b"{", b"[]", b'{"records": "x"}', b'{"records": []}', b'{"records": [], "more": 1}', b""],
)
def test_a_body_of_the_wrong_shape_is_refused_as_a_whole(client: TestClient, body: bytes) -> None:
    found = errors(client.post("/topics/text-lines/records", content=body, headers=JSON))
    assert None in found


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b'{"records": [{"key": null, "value": "\xff"}]}', "body: not UTF-8: byte 0xff at 37, "),
        (b"\xfe\xff", "body: not UTF-8: byte 0xfe at 0, "),
        (b"[" * 5000 + b"]" * 5000, "body: JSON nested too deeply to be read"),
        (b'{"records": [', "body: not JSON: Expecting value at character 13"),
    ],
)
def test_a_body_a_json_parser_cannot_read_is_a_422_naming_why(
    client: TestClient, producer: FakeProducer, body: bytes, reason: str
) -> None:
    found = errors(client.post("/topics/text-lines/records", content=body, headers=JSON))
    assert list(found) == [None]
    assert found[None].startswith(reason), found
    assert producer.sent == []


@pytest.mark.parametrize(
    "content_type",
    ["application/x-www-form-urlencoded", "text/plain", "application/xml", "text/x+json"],
)
def test_a_body_that_is_not_json_by_its_type_is_a_415(
    client: TestClient, producer: FakeProducer, content_type: str
) -> None:
    refused = sample(
        "streamstate_produce_refusals_total", topic="text-lines", reason="unsupported-media-type"
    )
    body = orjson.dumps({"records": [{"key": None, "value": "a line"}]})
    answer = client.post(
        "/topics/text-lines/records", content=body, headers={"content-type": content_type}
    )
    assert answer.status_code == 415, answer.text
    assert answer.json()["detail"] == (
        f"Content-Type {content_type!r}: the body must be JSON (Content-Type: application/json)"
    )
    assert producer.sent == []
    assert (
        sample(
            "streamstate_produce_refusals_total",
            topic="text-lines",
            reason="unsupported-media-type",
        )
        == refused + 1
    )


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"content-type": "application/json; charset=utf-8"},
        {"content-type": "application/vnd.shop+json"},
    ],
)
def test_a_json_body_is_read_with_a_json_type_or_none(
    client: TestClient, producer: FakeProducer, headers: dict[str, str]
) -> None:
    body = orjson.dumps({"records": [{"key": None, "value": "a line"}]})
    answer = client.post("/topics/text-lines/records", content=body, headers=headers)
    assert answer.status_code == 200, answer.text
    assert [r.value for r in producer.sent[0][1]] == [b"a line"]


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_a_compressed_body_is_inflated_within_the_body_limit(
    client: TestClient, producer: FakeProducer, encoding: str
) -> None:
    body = orjson.dumps({"records": [{"key": None, "value": f"line {n}"} for n in range(500)]})
    packed = gzip.compress(body) if encoding == "gzip" else zlib.compress(body)
    headers = {**JSON, "content-encoding": encoding}
    answer = client.post("/topics/text-lines/records", content=packed, headers=headers)
    assert answer.status_code == 200, answer.text
    assert len(producer.sent[0][1]) == 500
    # A small body that inflates past 1 MiB is refused as a large one is.
    bomb = gzip.compress(b" " * (MAX_BODY_BYTES + 1))
    assert len(bomb) < 5000
    answer = client.post(
        "/topics/text-lines/records", content=bomb, headers={**JSON, "content-encoding": "gzip"}
    )
    assert answer.status_code == 413, answer.text
    assert len(producer.sent) == 1


@pytest.mark.parametrize(
    ("encoding", "body", "status", "detail"),
    [
        ("br", b"anything", 415, "Content-Encoding 'br': the body must be sent as it is"),
        ("gzip", b"not gzip at all", 422, "body: not gzip: "),
        (
            "gzip",
            gzip.compress(b'{"records": []}', mtime=0)[:-12],
            422,
            "body: gzip data cut short",
        ),
    ],
    ids=["brotli", "not-gzip", "gzip-cut-short"],
)
def test_a_body_in_an_encoding_not_read_or_broken_is_refused(
    client: TestClient, producer: FakeProducer, encoding: str, body: bytes, status: int, detail: str
) -> None:
    headers = {**JSON, "content-encoding": encoding}
    answer = client.post("/topics/text-lines/records", content=body, headers=headers)
    assert answer.status_code == status, answer.text
    found = answer.json()
    assert (found["detail"] if status == 415 else found["errors"][0]["reason"]).startswith(detail)
    assert producer.sent == []


PROPERTY_API = make_api()
PROPERTY_API.state.producer = FakeProducer()
PROPERTY_CLIENT = TestClient(PROPERTY_API, headers=AUTH)


@example({"quantity": 0, "ts": 2**64}, None)  # beyond 64 bits
@settings(deadline=None, max_examples=80)
@given(
    st.fixed_dictionaries(
        {},
        optional={
            "event_id": st.sampled_from(["e", "", 5]),
            "store_id": st.sampled_from(["store-1", "", None]),
            "sku": st.just("sku-1"),
            "kind": st.sampled_from(["sale", "restock", "adjust", "refund"]),
            "quantity": st.integers(-3, 3) | st.floats(-3, 3),
            "unit_price": st.none() | st.floats(-1, 10),
            "ts": st.integers(-1, 2**64) | st.text(max_size=3),
        },
    ),
    st.sampled_from([None, "store-1", "store-2"]),
)
def test_the_api_accepts_an_item_event_exactly_when_the_stream_does(
    value: dict[str, Any], key: str | None
) -> None:
    answer = post(PROPERTY_CLIENT, "item-events", [{"key": key, "value": value}])
    # The bytes a producer sends (the stdlib's JSON: integers of any size, as a client's).
    raw = json.dumps(value, separators=(",", ":")).encode()
    try:
        event = parse_model(ItemEvent, raw)
        check_key(key.encode() if key else event.store_id.encode(), event.store_id, "store_id")
        stream_accepts = True
    except InvalidEvent:
        stream_accepts = False
    assert (answer.status_code == 200) == stream_accepts, answer.text


# -- topics, limits, token -------------------------------------------------------------


@pytest.mark.parametrize("topic", ["nope", "settled-sales", "text-lines-dlq", "corrections"])
def test_a_topic_that_is_not_a_source_is_not_found(client: TestClient, topic: str) -> None:
    answer = post(client, topic, [{"key": None, "value": "x"}])
    assert answer.status_code == 404
    assert "is not a source topic" in answer.json()["detail"]


def test_more_than_a_thousand_records_is_too_large(
    client: TestClient, producer: FakeProducer
) -> None:
    answer = post(client, "text-lines", [{"key": None, "value": "x"}] * 1001)
    assert answer.status_code == 413
    assert post(client, "text-lines", [{"key": None, "value": "x"}] * 1000).status_code == 200
    assert len(producer.sent[0][1]) == 1000


def test_a_body_over_one_mebibyte_is_too_large(client: TestClient) -> None:
    line = "x" * 60_000
    body = orjson.dumps({"records": [{"key": None, "value": line}] * 18})
    assert len(body) > MAX_BODY_BYTES
    answer = client.post("/topics/text-lines/records", content=body, headers=JSON)
    assert answer.status_code == 413
    assert answer.json()["detail"] == f"body of {len(body)} bytes; at most {MAX_BODY_BYTES}"


def test_a_chunked_body_is_cut_off_at_one_mebibyte(client: TestClient) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"records": [{"key": null, "value": "'
        for _ in range(20):
            yield b"x" * 60_000
        yield b'"}]}'

    answer = client.post("/topics/text-lines/records", content=chunks(), headers=JSON)
    assert answer.status_code == 413
    assert answer.json()["detail"] == f"body of more than {MAX_BODY_BYTES} bytes"


def test_without_the_bearer_token_nothing_is_looked_at(producer: FakeProducer) -> None:
    api = make_api()
    api.state.producer = producer
    client = TestClient(api)
    for topic in ("text-lines", "nope"):
        answer = post(client, topic, [{"key": None, "value": "x"}])
        assert answer.status_code == 401
        assert answer.headers["www-authenticate"] == "Bearer"
    wrong = {"Authorization": "Bearer nope"}
    answer = client.post("/topics/text-lines/records", content=b"x" * (2 << 20), headers=wrong)
    assert answer.status_code == 401
    assert answer.json()["detail"] == "invalid bearer token"
    basic = {"Authorization": "Basic dXNlcjpzM2NyZXQ="}
    answer = client.get("/topics", headers=basic)
    assert answer.status_code == 401
    assert answer.json()["detail"] == (
        "the Authorization header's scheme is 'Basic': send 'Authorization: Bearer <token>'"
    )
    assert client.get("/topics").json()["detail"] == "missing bearer token"
    assert producer.sent == []


def test_without_a_configured_token_no_header_is_needed(producer: FakeProducer) -> None:
    api = make_api(token=None)
    api.state.producer = producer
    assert post(TestClient(api), "text-lines", [{"key": None, "value": "x"}]).status_code == 200


def test_kafka_out_of_reach_is_a_503_with_retry_after() -> None:
    with socket.socket() as closed:  # a port where nothing listens
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
        api = make_api(bootstrap=f"127.0.0.1:{port}")
        answer = post(TestClient(api, headers=AUTH), "text-lines", [{"key": None, "value": "x"}])
    assert answer.status_code == 503
    assert answer.headers["retry-after"] == "2"
    assert "cannot connect to Kafka" in answer.json()["detail"]


def test_with_no_live_broker_connection_a_write_is_refused_at_once(producer: FakeProducer) -> None:
    """The worker's consumer has lost every broker (what /ready reports): the write is
    refused before anything reaches the producer, not after its acknowledgement timeout
    with records that may still be written later."""
    api = make_api()
    api.state.producer = producer
    api.state.worker.membership.broker_connected = lambda: False
    answer = post(TestClient(api, headers=AUTH), "text-lines", [{"key": None, "value": "x"}])
    assert answer.status_code == 503
    assert answer.headers["retry-after"] == "2"
    assert answer.json()["detail"].startswith("no live connection to any Kafka broker of ")
    assert answer.json()["detail"].endswith("; nothing was written")
    assert producer.sent == []


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_written_records_and_refusals_are_counted(client: TestClient) -> None:
    produced = sample("streamstate_produced_records_total", topic="payments")
    invalid = sample("streamstate_produce_refusals_total", topic="payments", reason="invalid")
    unknown = sample("streamstate_produce_refusals_total", topic="other", reason="unknown-topic")
    post(client, "payments", [{"key": None, "value": payment()}] * 3)
    post(client, "payments", [{"key": None, "value": {}}])
    post(client, "no-such-topic", [{"key": None, "value": "x"}])
    assert sample("streamstate_produced_records_total", topic="payments") == produced + 3
    assert (
        sample("streamstate_produce_refusals_total", topic="payments", reason="invalid")
        == invalid + 1
    )
    assert (
        sample("streamstate_produce_refusals_total", topic="other", reason="unknown-topic")
        == unknown + 1
    )
    text = client.get("/metrics").text
    assert 'streamstate_produced_records_total{topic="payments"}' in text


# -- the OpenAPI document ----------------------------------------------------------------

PRODUCE = "/topics/{topic}/records"


def test_the_produce_route_documents_its_body_answers_and_errors() -> None:
    document = TestClient(make_api()).get("/openapi.json").json()
    operation = document["paths"][PRODUCE]["post"]
    body = operation["requestBody"]["content"]["application/json"]
    assert body["schema"] == {"$ref": "#/components/schemas/ProduceRequest"}
    assert set(body["examples"]) == {"text", "json"}
    responses = operation["responses"]
    assert set(responses) == {"200", "401", "404", "408", "413", "415", "422", "503"}
    schema = responses["422"]["content"]["application/json"]["schema"]
    assert schema == {"$ref": "#/components/schemas/InvalidRecordsDetail"}
    assert "Retry-After" in responses["503"]["headers"]
    assert operation["security"] == [{"HTTPBearer": []}]
    records = document["components"]["schemas"]["ProduceRequest"]["properties"]["records"]
    assert (records["minItems"], records["maxItems"]) == (1, 1000)


def test_the_documented_answer_example_is_a_real_token() -> None:
    schemas = TestClient(make_api()).get("/openapi.json").json()["components"]["schemas"]
    [example] = schemas["Produced"]["examples"]
    token = decode_token(example["token"], APP_ID, topics={example["topic"]})
    assert token.topic == example["topic"]
    assert token == Token(
        example["topic"], {o["partition"]: o["offset"] + 1 for o in example["offsets"]}
    )


@pytest.mark.parametrize(
    ("example_name", "topic"), [("text", "text-lines"), ("json", "page-views")]
)
def test_each_documented_request_example_is_accepted(example_name: str, topic: str) -> None:
    api = make_api(extra_pipelines="pageviews")  # the tutorial's pipeline: docs/tutorial/
    api.state.producer = FakeProducer()
    operation = TestClient(api).get("/openapi.json").json()["paths"][PRODUCE]["post"]
    examples = operation["requestBody"]["content"]["application/json"]["examples"]
    example = examples[example_name]
    answer = TestClient(api, headers=AUTH).post(f"/topics/{topic}/records", json=example["value"])
    assert answer.status_code == 200, answer.text


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ({"user": "ann"}, "ts: Field required"),
        ({"user": "ann", "ts": "12"}, "ts: the event time must be whole milliseconds, not '12'"),
        ({"user": "ann", "ts": True}, "ts: the event time must be whole milliseconds, not True"),
        ({"user": "ann", "ts": 1.5}, "ts: the event time must be whole milliseconds, not 1.5"),
        (
            {"user": "ann", "ts": -1},
            "ts: the event time -1 ms is out of range (0 to 253402300799999)",
        ),
        ({"ts": 5}, "user: Field required"),
        ({"user": "", "ts": 5}, "key: 0 bytes; a key is 1 to 1024 bytes, as reads take it"),
        (
            {"user": "é" * 600, "ts": 5},
            "key: 1200 bytes; a key is 1 to 1024 bytes, as reads take it",
        ),
    ],
)
def test_a_json_topics_key_and_time_fields_are_checked_as_the_stream_checks_them(
    value: dict[str, Any], reason: str
) -> None:
    from api.records import check
    from core.values import Json
    from tables.pipeline import SourceSpec

    spec = SourceSpec("clicks", Json, key="user", timestamp="ts")
    with pytest.raises(InvalidEvent) as refused:
        check(spec, None, value, 1 << 20)
    assert refused.value.reason == reason
    assert check(spec, None, {"user": "ann", "ts": 5.0}, 1 << 20).key == b"ann"


def test_a_body_that_stops_arriving_is_refused_in_time_and_a_client_that_leaves_quietly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import asyncio

    from starlette.requests import Request

    from api import bodies
    from api.errors import RequestTimeout

    monkeypatch.setattr(bodies, "BODY_TIMEOUT_S", 0.2)

    def request(then: dict[str, Any] | None) -> Request:
        sent = [{"type": "http.request", "body": b'{"records"', "more_body": True}]

        async def receive() -> dict[str, Any]:
            if sent:
                return sent.pop()
            if then is None:
                await asyncio.sleep(3600)  # the rest never comes
            return then  # type: ignore[return-value]

        scope = {"type": "http", "method": "POST", "headers": [(b"content-length", b"100")]}
        return Request(scope, receive)

    with pytest.raises(RequestTimeout, match=r"did not arrive within 0.2 s \(10 bytes came\)"):
        asyncio.run(bodies.read_bounded(request(None)))
    with pytest.raises(RequestTimeout, match="closed the connection before its body arrived"):
        asyncio.run(bodies.read_bounded(request({"type": "http.disconnect"})))


def test_a_key_with_a_line_break_is_routed_like_any_other() -> None:
    from api.app import create_api  # noqa: F401 (the routes, made after the convertor)
    from api.routes.metadata import router as metadata
    from api.routes.tables import router as tables

    routes = [*tables.routes, *metadata.routes]
    paths = {
        "/tables/views/keys/nl\nkey": "nl\nkey",
        "/tables/views/keys/\n": "\n",
        "/tables/views/keys/a\nb/changes": "a\nb",
    }
    for path, key in paths.items():
        found = [
            r.param_convertors and r.path_regex.match(path)  # type: ignore[attr-defined]
            for r in routes
        ]
        matches = [m for m in found if m]
        assert matches, path
        assert any(m.group("key") == key for m in matches), path
