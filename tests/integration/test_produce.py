"""POST /topics/{topic}/records against a real broker and a running worker: records land
where the answer says, invalid batches write nothing, the limits and the token rule
hold, and what is written is counted by the worker's pipelines."""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from api.tokens import Token, decode_token
from core.topics import partition_for
from tests.support.kafka import TEST_PORT, LocalKafka, local_kafka
from tests.support.kafka_io import Record, read_topic, wait_for
from tests.support.ports import require_free_port
from tests.support.workers import Worker

pytestmark = pytest.mark.integration

TOKEN = "produce-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
APP_ID = "streamstate"


@dataclass
class Setup:
    kafka: LocalKafka
    worker: Worker


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    require_free_port(TEST_PORT)
    with local_kafka("produce") as kafka:
        worker = Worker(
            kafka,
            tmp_path_factory.mktemp("produce") / "w0",
            extra_env={"STREAMSTATE_API_TOKEN": TOKEN},
        ).start()
        try:
            worker.wait_ready(180)
            yield Setup(kafka, worker)
        finally:
            worker.stop()


def post(
    worker: Worker, topic: str, body: Any, headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    """POST JSON (or raw bytes) with the token: (status, decoded JSON answer)."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(
        f"{worker.url}/topics/{urllib.parse.quote(topic, safe='')}/records",
        data=data,
        headers={"Content-Type": "application/json", **AUTH, **(headers or {})},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def get(worker: Worker, path: str) -> tuple[int, Any]:
    request = urllib.request.Request(worker.url + path, headers=AUTH)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            raw = answer.read()
            return answer.status, raw if path == "/metrics" else json.loads(raw)
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def at(records: list[Record]) -> dict[tuple[int, int], Record]:
    return {(r.partition, r.offset): r for r in records}


def sale(event_id: str, store: str, ts: int) -> dict[str, Any]:
    return {"event_id": event_id, "store_id": store, "sku": "sku-1", "kind": "sale",
            "quantity": 1, "unit_price": 2.0, "ts": ts}  # fmt: skip


NOW = int(time.time() * 1000)
BATCHES: dict[str, list[dict[str, Any]]] = {
    "text-lines": [
        {"key": None, "value": "written through the api"},
        {"key": "k", "value": "über die brücke"},
        {"key": None, "value": "a third line"},
    ],
    "item-events": [
        {"key": None, "value": sale("api-e1", "api-store-1", NOW)},
        {"key": "api-store-2", "value": sale("api-e2", "api-store-2", NOW)},
        {"key": None, "value": sale("api-e3", "api-store-1", NOW + 1)},
    ],
    "payments": [
        {
            "key": None,
            "value": {
                "payment_id": "api-p1",
                "sale_event_id": "api-e1",
                "store_id": "api-store-1",
                "amount": 2.0,
                "ts": NOW,
            },
        },
    ],
    "products": [
        {"key": None, "value": {"sku": "api-sku-1", "name": "rye bread", "category": "bakery"}},
        {"key": "api-sku-2", "value": {"sku": "api-sku-2", "name": "kefir", "category": "dairy"}},
    ],
}


def expected_bytes(topic: str, record: dict[str, Any]) -> tuple[bytes | None, bytes]:
    value = record["value"]
    if topic == "text-lines":
        key = None if record["key"] is None else record["key"].encode()
        return key, value.encode()
    field = "sku" if topic == "products" else "store_id"
    return value[field].encode(), json.dumps(
        value, separators=(",", ":"), ensure_ascii=False
    ).encode()


@pytest.mark.parametrize("topic", sorted(BATCHES))
def test_a_valid_batch_lands_at_the_offsets_the_answer_gives(setup: Setup, topic: str) -> None:
    batch = BATCHES[topic]
    status, body = post(setup.worker, topic, {"records": batch})
    assert status == 200, body
    assert body["topic"] == topic
    assert len(body["offsets"]) == len(batch)
    landed = at(read_topic(setup.kafka.bootstrap, topic))
    for record, place in zip(batch, body["offsets"], strict=True):
        found = landed[(place["partition"], place["offset"])]
        key, value = expected_bytes(topic, record)
        assert (found.key, found.value) == (key, value)
        if key is not None:
            assert place["partition"] == partition_for(key, 8)
    ends: dict[int, int] = {}
    for place in body["offsets"]:
        ends[place["partition"]] = max(ends.get(place["partition"], 0), place["offset"] + 1)
    assert decode_token(body["token"], APP_ID, topics={topic}) == Token(topic, ends)


def test_an_invalid_batch_names_each_bad_record_and_writes_nothing(setup: Setup) -> None:
    before = read_topic(setup.kafka.bootstrap, "payments")
    good = BATCHES["payments"][0]
    bad_key = {"key": "another-store", "value": good["value"]}
    bad_amount = {"key": None, "value": {**good["value"], "amount": -1}}
    status, body = post(setup.worker, "payments", {"records": [good, bad_key, good, bad_amount]})
    assert status == 422, body
    reasons = {e["index"]: e["reason"] for e in body["errors"]}
    assert sorted(reasons) == [1, 3]
    assert reasons[1] == "key: 'another-store' does not match store_id 'api-store-1'"
    assert reasons[3].startswith("amount: ")
    assert body["detail"] == "2 invalid records; nothing was written"
    assert read_topic(setup.kafka.bootstrap, "payments") == before


@pytest.mark.parametrize("topic", ["no-such-topic", "settled-sales", "payments-dlq"])
def test_a_topic_that_is_not_a_source_is_not_found(setup: Setup, topic: str) -> None:
    status, body = post(setup.worker, topic, {"records": [{"key": None, "value": "x"}]})
    assert status == 404
    assert "is not a source topic" in body["detail"]


def test_a_body_over_the_limit_is_refused_before_it_is_read(setup: Setup) -> None:
    with socket.create_connection(("127.0.0.1", setup.worker.port), timeout=10) as conn:
        conn.sendall(
            b"POST /topics/text-lines/records HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            + f"Authorization: Bearer {TOKEN}\r\n".encode()
            + b"Content-Type: application/json\r\nContent-Length: 5000000\r\n\r\n"
        )
        head = conn.recv(4096).decode("latin-1")  # no byte of the body was sent
    assert head.startswith("HTTP/1.1 413 ")


def test_a_body_over_the_limit_sent_whole_is_refused(setup: Setup) -> None:
    """A client that sends the whole body before it reads (urllib does) reads the 413:
    the worker drops what arrives of a refused body instead of resetting the connection."""
    line = "x" * 60_000
    for records in (20, 60):  # 1.2 MB and 3.6 MB
        status, body = post(setup.worker, "text-lines", {"records": [{"value": line}] * records})
        assert status == 413, body
    status, body = post(setup.worker, "text-lines", {"records": [{"value": "x"}] * 1001})
    assert status == 413, body


def test_without_the_bearer_token_the_answer_is_401(setup: Setup) -> None:
    for headers in ({"Authorization": ""}, {"Authorization": "Bearer wrong"}):
        status, body = post(setup.worker, "text-lines", {"records": [{"value": "x"}]}, headers)
        assert status == 401, body


def test_written_records_are_counted_by_the_running_worker(setup: Setup) -> None:
    line = {"key": None, "value": "Quokka zebrafish quokka"}
    assert post(setup.worker, "text-lines", {"records": [line]})[0] == 200
    restock = {"event_id": "api-r1", "store_id": "api-store-9", "sku": "sku-9",
               "kind": "restock", "quantity": 5, "ts": NOW}  # fmt: skip
    assert (
        post(setup.worker, "item-events", {"records": [{"key": None, "value": restock}]})[0] == 200
    )

    def value(path: str) -> Any:
        status, body = get(setup.worker, path)
        return body["value"] if status == 200 else None

    assert wait_for(lambda: value("/tables/word_counts/keys/quokka"), 60) == 2
    assert value("/tables/word_counts/keys/zebrafish") == 1
    inventory = wait_for(lambda: value("/tables/inventory/keys/api-store-9"), 60)
    assert inventory["on_hand"] == {"sku-9": 5}


def counted(lines: list[str], name: str, **labels: str) -> float:
    """The value of the sample ``name{labels}`` in Prometheus text lines (0 if absent)."""
    for line in lines:
        series, _, value = line.rpartition(" ")
        if series.startswith(name + "{") and all(f'{k}="{v}"' in series for k, v in labels.items()):
            return float(value)
    return 0.0


def test_writes_and_refusals_show_in_metrics(setup: Setup) -> None:
    def lines() -> list[str]:
        status, text = get(setup.worker, "/metrics")
        assert status == 200
        return list(text.decode().splitlines())

    name = "streamstate_produce_refusals_total"
    refused = counted(lines(), name, topic="text-lines", reason="invalid")
    written = counted(lines(), "streamstate_produced_records_total", topic="text-lines")
    assert post(setup.worker, "text-lines", {"records": [{"value": 5}]})[0] == 422
    assert post(setup.worker, "text-lines", {"records": [{"value": "a"}, {"value": "b"}]})[0] == 200
    after = lines()
    assert counted(after, name, topic="text-lines", reason="invalid") == refused + 1
    assert counted(after, "streamstate_produced_records_total", topic="text-lines") == written + 2
