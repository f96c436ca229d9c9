"""Consistency over HTTP on a real broker with three workers: positions on reads, reads
that wait for a write's token on every worker (through a kill -9 of the owner too),
bounded staleness, and change streams (in order, resumable, 1,000 at once, 100 relayed
at once by a worker that does not own the key, moved on a rebalance; only a last path
segment `changes` as sent opens one)."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from agents.words import tokenize
from api.tokens import Token, encode_token
from tests.support.kafka import TEST_PORT, LocalKafka, local_kafka
from tests.support.kafka_io import changelog_values, produce, wait_for
from tests.support.workers import Worker

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

APP_ID = "streamstate"
PARTITIONS = 8


@dataclass
class Group:
    kafka: LocalKafka
    workers: list[Worker]

    def live(self) -> list[Worker]:
        return [w for w in self.workers if w.alive()]


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Group]:
    with local_kafka("consistency", port=TEST_PORT + 1500) as kafka:
        base = tmp_path_factory.mktemp("consistency")
        workers = [Worker(kafka, base / f"w{i}").start() for i in range(3)]
        try:
            for worker in workers:
                worker.wait_ready(180)
            yield Group(kafka, workers)
        finally:
            # Stopping one worker rebalances the others while they stop in turn: a SIGTERM
            # must end each of them even then.
            hung = [w.url for w in workers if not w.stop()]
            assert not hung, f"workers that a SIGTERM did not stop within 30 s: {hung}"


def call(worker: Worker, path: str, body: Any = None, timeout: float = 45) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        worker.url + path,
        data=data,
        headers={"Content-Type": "application/json"},
        method="GET" if body is None else "POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def write(worker: Worker, topic: str, values: list[Any]) -> dict[str, Any]:
    status, body = call(
        worker,
        f"/topics/{topic}/records",
        {"records": [{"key": None, "value": value} for value in values]},
    )
    assert status == 200, body
    return dict(body)


def restock(store: str, sku: str, quantity: int) -> dict[str, Any]:
    return {
        "event_id": uuid.uuid4().hex,
        "store_id": store,
        "sku": sku,
        "kind": "restock",
        "quantity": quantity,
        "ts": int(time.time() * 1000),
    }


def token_path(table: str, key: str, token: str, **params: Any) -> str:
    query = urllib.parse.urlencode({"consistent_with": token, **params})
    return f"/tables/{table}/keys/{urllib.parse.quote(key, safe='')}?{query}"


def owner_of(group: Group, table: str, key: str) -> Worker:
    _, meta = call(group.live()[0], f"/metadata/tables/{table}/keys/{key}")
    return next(w for w in group.live() if w.url == meta["active"])


def test_a_write_is_read_back_with_its_token_on_every_worker(group: Group) -> None:
    store = f"store-{uuid.uuid4().hex[:8]}"
    written = write(group.workers[0], "item-events", [restock(store, "sku-1", 5)])
    [where] = written["offsets"]
    for worker in group.workers:
        status, body = call(worker, token_path("inventory", store, written["token"]))
        assert status == 200, body
        assert body["value"]["on_hand"] == {"sku-1": 5}
        applied = body["position"]["applied"]["item-events"]
        assert applied == {str(where["partition"]): applied[str(where["partition"])]}
        assert applied[str(where["partition"])] >= where["offset"] + 1


def test_a_line_written_is_counted_by_a_token_read_of_word_counts(group: Group) -> None:
    word = f"quagga{uuid.uuid4().hex[:10]}"
    written = write(group.workers[1], "text-lines", [f"{word} {word.upper()} {word}"])
    for worker in group.workers:
        status, body = call(worker, token_path("word_counts", word, written["token"]))
        assert status == 200, body
        assert body["value"] == 3
        # every text-lines partition feeds every word_counts partition
        assert sorted(body["position"]["applied"]["text-lines"]) == [
            str(p) for p in range(PARTITIONS)
        ]


def test_tokens_that_cannot_be_used_are_refused_with_a_reason(group: Group) -> None:
    worker = group.workers[0]
    status, body = call(worker, token_path("word_counts", "any", "not*a*token"))
    assert status == 400
    assert body["detail"].startswith("consistent_with:")
    payments = encode_token(Token("payments", {0: 1}), APP_ID)
    status, body = call(worker, token_path("word_counts", "any", payments))
    assert status == 400
    assert "payments, which does not feed word_counts" in body["detail"]
    foreign = encode_token(Token("text-lines", {0: 1}), "another-app")
    status, body = call(worker, token_path("word_counts", "any", foreign))
    assert status == 400
    status, body = call(worker, token_path("word_counts", "any", payments, timeout_ms=30_001))
    assert status == 422


def test_a_position_no_copy_reaches_in_time_is_a_504_with_the_position_reached(
    group: Group,
) -> None:
    store = "store-far-ahead"
    ahead = {p: 10**12 for p in range(PARTITIONS)}
    token = encode_token(Token("item-events", ahead), APP_ID)
    status, body = call(group.workers[2], token_path("inventory", store, token, timeout_ms=300))
    assert status == 504, body
    [(partition, applied)] = body["position"]["applied"]["item-events"].items()
    assert body["waiting_for"] == {"item-events": {partition: 10**12}}
    assert applied < 10**12


def test_a_caught_up_copy_answers_within_any_staleness_bound(group: Group) -> None:
    store = f"store-{uuid.uuid4().hex[:8]}"
    written = write(group.workers[0], "item-events", [restock(store, "sku-2", 1)])
    call(group.workers[0], token_path("inventory", store, written["token"]))

    def bounded() -> Any:
        status, body = call(
            group.workers[0],
            f"/tables/inventory/keys/{store}?max_lag_records=0&max_lag_ms=0",
        )
        return body if status == 200 else None

    body = wait_for(bounded, 30)
    assert body["position"]["lag_records"] == 0
    assert body["position"]["lag_ms"] == 0


def test_a_product_written_is_read_back_with_its_token_from_every_global_copy(
    group: Group,
) -> None:
    sku = f"sku-{uuid.uuid4().hex[:10]}"
    product = {"sku": sku, "name": "Quill", "category": "pens"}
    written = write(group.workers[1], "products", [product])
    [where] = written["offsets"]
    partition = str(where["partition"])
    for worker in group.live():
        status, body = call(worker, token_path("products", sku, written["token"]))
        assert status == 200, body
        assert (body["replica"], body["value"]) == ("global", product)
        assert body["position"]["partition"] == where["partition"]
        [(topic, applied)] = body["position"]["applied"].items()
        assert (topic, list(applied)) == ("products", [partition])
        assert applied[partition] >= where["offset"] + 1
    # a plain read carries the position too; a bound holds once the copy caught up
    status, body = call(group.workers[0], f"/tables/products/keys/{sku}")
    assert status == 200
    assert body["position"]["applied"]["products"][partition] >= where["offset"] + 1

    def bounded() -> Any:
        status, body = call(group.workers[1], f"/tables/products/keys/{sku}?max_lag_records=0")
        return body if status == 200 else None

    assert wait_for(bounded, 30)["position"]["lag_records"] == 0
    ahead = encode_token(Token("products", {where["partition"]: 10**12}), APP_ID)
    status, body = call(group.workers[2], token_path("products", sku, ahead, timeout_ms=300))
    assert status == 504, body
    assert body["waiting_for"] == {"products": {partition: 10**12}}
    assert body["position"]["applied"]["products"][partition] >= where["offset"] + 1
    other = encode_token(Token("item-events", {0: 1}), APP_ID)
    status, body = call(group.workers[0], token_path("products", sku, other))
    assert status == 400
    assert "item-events, which does not feed products" in body["detail"]


@dataclass
class Event:
    event: str
    data: dict[str, Any]
    id: str | None


async def sse(response: aiohttp.ClientResponse) -> AsyncIterator[Event]:
    """The events of a server-sent event stream (comments skipped)."""
    fields: dict[str, str] = {}
    async for raw in response.content:
        line = raw.decode().rstrip("\n")
        if not line:
            if "event" in fields or "data" in fields:
                yield Event(
                    fields.get("event", "message"),
                    json.loads(fields.get("data", "{}")),
                    fields.get("id"),
                )
            fields = {}
        elif not line.startswith(":"):
            name, _, value = line.partition(": ")
            fields[name] = value


def stream_url(worker: Worker, table: str, key: str) -> str:
    return f"{worker.url}/tables/{table}/keys/{urllib.parse.quote(key, safe='')}/changes"


async def produce_restocks(kafka: LocalKafka, store: str, n: int, per_s: float) -> None:
    loop = asyncio.get_running_loop()
    batch = 50
    for start in range(0, n, batch):
        events = [(store, restock(store, "sku-s", 1)) for _ in range(min(batch, n - start))]
        await loop.run_in_executor(None, produce, kafka.bootstrap, "item-events", events)
        await asyncio.sleep(batch / per_s)


def test_a_change_stream_delivers_every_value_the_table_takes_in_order(group: Group) -> None:
    store = f"store-{uuid.uuid4().hex[:8]}"
    owner = owner_of(group, "inventory", store)
    relay = next(w for w in group.workers if w is not owner)

    async def run() -> list[Event]:
        seen: list[Event] = []
        async with (
            aiohttp.ClientSession() as session,
            session.get(
                stream_url(relay, "inventory", store), timeout=aiohttp.ClientTimeout(total=120)
            ) as response,
        ):
            assert response.status == 200
            assert response.headers["Content-Type"].startswith("text/event-stream")
            events = sse(response)
            first = await anext(events)
            assert first.event == "absent"
            producing = asyncio.ensure_future(produce_restocks(group.kafka, store, 1000, 1000))
            async for event in events:
                seen.append(event)
                if event.data["value"]["on_hand"]["sku-s"] == 1000:
                    break
            await producing
        return seen

    seen = asyncio.run(asyncio.wait_for(run(), 150))
    assert all(event.event == "change" for event in seen)
    counts = [event.data["value"]["on_hand"]["sku-s"] for event in seen]
    assert counts == sorted(set(counts))  # in order, each value once
    # exactly the values the table took: the changelog's, in order
    history = [
        v["on_hand"]["sku-s"]
        for v in changelog_values(group.kafka.bootstrap, "inventory", store.encode())
    ]
    assert counts == history
    assert seen[-1].data["position"]["applied"]["item-events"]


def test_a_reconnect_with_last_event_id_resumes_without_repeating_the_latest_value(
    group: Group,
) -> None:
    store = f"store-{uuid.uuid4().hex[:8]}"
    written = write(group.workers[0], "item-events", [restock(store, "sku-r", 2)])
    call(group.workers[0], token_path("inventory", store, written["token"]))

    async def run() -> tuple[Event, Event]:
        url = stream_url(group.workers[0], "inventory", store)
        async with aiohttp.ClientSession() as session:
            async with session.get(url) as response:
                first = await anext(sse(response))
            headers = {"Last-Event-ID": first.id or ""}
            async with session.get(url, headers=headers) as response:
                events = sse(response)
                write(group.workers[0], "item-events", [restock(store, "sku-r", 3)])
                resumed = await asyncio.wait_for(anext(events), 30)
        return first, resumed

    first, resumed = asyncio.run(run())
    assert first.data["value"]["on_hand"] == {"sku-r": 2}
    assert first.id
    assert resumed.data["value"]["on_hand"] == {"sku-r": 5}  # not the value it had


def test_a_global_tables_key_streams_its_changes_from_every_worker(group: Group) -> None:
    sku = f"sku-{uuid.uuid4().hex[:8]}"

    def product(name: str) -> dict[str, Any]:
        return {"sku": sku, "name": name, "category": "dairy"}

    async def run() -> list[list[Event]]:
        async with aiohttp.ClientSession() as session:
            responses = [
                await session.get(
                    stream_url(worker, "products", sku), timeout=aiohttp.ClientTimeout(total=60)
                )
                for worker in group.live()
            ]
            streams = [sse(response) for response in responses]
            seen = [[await asyncio.wait_for(anext(events), 30)] for events in streams]
            live = group.live()
            write(live[0], "products", [product("oat milk")])
            write(live[-1], "products", [product("oat drink")])
            for got, events in zip(seen, streams, strict=True):
                while len(got) < 3:
                    got.append(await asyncio.wait_for(anext(events), 30))
            for response in responses:
                assert response.status == 200
                response.close()
            return seen

    for seen in asyncio.run(asyncio.wait_for(run(), 90)):
        assert [e.event for e in seen] == ["absent", "change", "change"]
        assert [e.data["value"]["name"] for e in seen[1:]] == ["oat milk", "oat drink"]
        [(topic, applied)] = seen[2].data["position"]["applied"].items()
        assert topic == "products"
        assert next(iter(applied.values())) > 0
        assert seen[1].id != seen[2].id


def test_a_thousand_change_streams_on_one_worker_each_get_the_change(group: Group) -> None:
    store = f"store-{uuid.uuid4().hex[:8]}"
    owner = owner_of(group, "inventory", store)

    async def run() -> list[int]:
        connector = aiohttp.TCPConnector(limit=0)
        timeout = aiohttp.ClientTimeout(total=120)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            responses = await asyncio.gather(
                *(session.get(stream_url(owner, "inventory", store)) for _ in range(1000))
            )
            streams = [sse(r) for r in responses]
            firsts = await asyncio.gather(*(anext(s) for s in streams))
            assert {e.event for e in firsts} == {"absent"}
            write(owner, "item-events", [restock(store, "sku-t", 7)])
            changes = await asyncio.gather(*(anext(s) for s in streams))
            for response in responses:
                response.release()
        return [e.data["value"]["on_hand"]["sku-t"] for e in changes]

    assert asyncio.run(run()) == [7] * 1000


def quoted(key: str) -> str:
    return urllib.parse.quote(key, safe="")


def read_json(worker: Worker, path: str, method: str = "GET") -> tuple[int, Any, Any]:
    """(status, decoded JSON, headers) of a key read; fails at once on an answer that is not
    JSON (a change stream would never end)."""
    request = urllib.request.Request(worker.url + path, method=method)
    try:
        answer = urllib.request.urlopen(request, timeout=30)
    except urllib.error.HTTPError as error:
        answer = error
    with answer:
        kind = answer.headers.get("Content-Type", "")
        assert kind.startswith("application/json"), f"{path} answered {kind}"
        raw = answer.read()
        return answer.status, json.loads(raw) if raw else None, answer.headers


async def first_event(session: aiohttp.ClientSession, url: str) -> Event:
    async with session.get(url) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/event-stream")
        return await anext(sse(response))


def test_a_key_ending_in_changes_is_read_as_itself_and_its_stream_is_its_own(
    group: Group,
) -> None:
    store = f"store-{uuid.uuid4().hex[:8]}"
    quantities = {store: 5, f"{store}/changes": 7, "changes": 3}
    restocks = [restock(key, "sku-c", n) for key, n in quantities.items()]
    token = write(group.workers[0], "item-events", restocks)["token"]
    for worker in group.workers:
        for key, n in quantities.items():
            path = f"/tables/inventory/keys/{quoted(key)}"
            status, body, _ = read_json(worker, token_path("inventory", key, token))
            assert (status, body["key"], body["value"]["on_hand"]) == (200, key, {"sku-c": n})
            status, body, headers = read_json(worker, path)  # the lean path's read
            assert (status, body["key"], body["value"]["on_hand"]) == (200, key, {"sku-c": n})
            status, _, head = read_json(worker, path, method="HEAD")  # FastAPI's read
            assert (status, head["X-Served-By"]) == (200, headers["X-Served-By"])
            status, body, _ = read_json(worker, path + "?at=1")  # the read's own options
            assert status == 400
            assert "windowed" in body["detail"]
            status, body, _ = read_json(worker, f"/metadata/tables/inventory/keys/{quoted(key)}")
            assert (status, body["key"]) == (200, key)

    async def firsts() -> list[Event]:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
            return await asyncio.gather(
                *(
                    first_event(session, stream_url(worker, "inventory", key))
                    for worker in group.workers
                    for key in quantities
                )
            )

    seen = [e.data["value"]["on_hand"]["sku-c"] for e in asyncio.run(firsts())]
    assert seen == list(quantities.values()) * len(group.workers)


def test_a_hundred_relayed_change_streams_each_open_and_routed_reads_still_answer(
    group: Group,
) -> None:
    store = f"store-{uuid.uuid4().hex[:8]}"
    owner = owner_of(group, "inventory", store)
    relay = next(w for w in group.live() if w is not owner)
    written = write(relay, "item-events", [restock(store, "sku-h", 1)])
    call(relay, token_path("inventory", store, written["token"]))

    async def run() -> tuple[list[Event], list[Event], int, Any]:
        connector = aiohttp.TCPConnector(limit=0)
        timeout = aiohttp.ClientTimeout(total=60)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            url = stream_url(relay, "inventory", store)
            opening = [asyncio.ensure_future(session.get(url)) for _ in range(100)]
            _, waiting = await asyncio.wait(opening, timeout=15)
            for never in waiting:
                never.cancel()
            assert not waiting, f"{len(waiting)} of 100 relayed streams had no answer in 15 s"
            responses = [opened.result() for opened in opening]
            assert [r.status for r in responses] == [200] * 100
            streams = [sse(r) for r in responses]
            firsts = await asyncio.wait_for(asyncio.gather(*(anext(s) for s in streams)), 15)
            loop = asyncio.get_running_loop()
            path = f"/tables/inventory/keys/{store}"
            status, body = await loop.run_in_executor(None, call, relay, path)
            write(relay, "item-events", [restock(store, "sku-h", 1)])
            changes = await asyncio.wait_for(asyncio.gather(*(anext(s) for s in streams)), 15)
            for response in responses:
                response.release()
        return firsts, changes, status, body

    firsts, changes, status, body = asyncio.run(run())
    assert [e.data["value"]["on_hand"]["sku-h"] for e in firsts] == [1] * 100
    assert [e.data["value"]["on_hand"]["sku-h"] for e in changes] == [2] * 100
    assert (status, body["served_by"]) == (200, owner.url)


def test_every_word_of_a_written_line_is_in_the_answer_of_its_token(group: Group) -> None:
    words = [f"w{uuid.uuid4().hex[:6]}" for _ in range(5)]
    line = " ".join(words)
    written = write(group.live()[0], "text-lines", [line])
    for word in list(tokenize(line)):
        status, body = call(group.live()[-1], token_path("word_counts", word, written["token"]))
        assert (status, body["value"]) == (200, 1)


def metric(worker: Worker, name: str) -> float:
    with urllib.request.urlopen(worker.url + "/metrics", timeout=10) as answer:
        text = answer.read().decode()
    values = [line.split()[-1] for line in text.splitlines() if line.startswith(name + " ")]
    return float(values[0]) if values else 0.0


def test_metrics_count_waits_timeouts_and_streams(group: Group) -> None:
    workers = group.live()
    assert sum(metric(w, "streamstate_position_wait_timeouts_total") for w in workers) >= 1
    assert sum(metric(w, "streamstate_position_waits_total") for w in workers) >= 1
    assert sum(metric(w, "streamstate_change_streams_total") for w in workers) >= 1000


def test_a_token_read_waits_for_the_new_owner_after_a_kill9_and_streams_move(
    group: Group,
) -> None:
    # Last in the module: it kills a worker.
    store = f"store-{uuid.uuid4().hex[:8]}"
    owner = owner_of(group, "inventory", store)
    survivor = next(w for w in group.workers if w is not owner)
    word = "wordmoves"
    word_owner = owner_of(group, "word_counts", word)

    async def run() -> tuple[int, Any, list[str]]:
        async with (
            aiohttp.ClientSession() as session,
            session.get(stream_url(word_owner, "word_counts", word)) as response,
        ):
            events = sse(response)
            await anext(events)
            written = write(survivor, "item-events", [restock(store, "sku-k", 4)])
            owner.kill9()
            loop = asyncio.get_running_loop()
            status, body = await loop.run_in_executor(
                None,
                call,
                survivor,
                token_path("inventory", store, written["token"], timeout_ms=30_000),
            )
            ends = []
            if word_owner is not owner:  # a rebalance ends the survivor's own streams
                ends = [e.event async for e in events]
        return status, body, ends

    status, body, ends = asyncio.run(asyncio.wait_for(run(), 120))
    assert status == 200, body
    assert body["value"]["on_hand"] == {"sku-k": 4}
    if word_owner is not owner:
        assert ends[-1] == "moved"
