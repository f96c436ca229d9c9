"""The tutorial's pipeline (docs/tutorial/pageviews.py), a module outside the project's
packages, run by two real workers on a real broker: every HTTP feature of the demo
tables holds for its tables, with no edit outside the module."""

from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.kafka import ROOT, TEST_PORT, LocalKafka, local_kafka
from tests.support.kafka_io import produce, read_topic, wait_for
from tests.support.workers import Worker, stop_workers

pytestmark = pytest.mark.integration

MINUTE = 60_000
#: How long a read waits for a write's position, and for its answer (seconds).
WAIT_MS = 30_000
HTTP_TIMEOUT = 40.0
#: Event time of the views: the start of a 5-minute window, an hour ago (well within the
#: windows' retention, and so every window is closed).
T0 = (int(time.time() * 1000) - 3_600_000) // (5 * MINUTE) * (5 * MINUTE)


@pytest.fixture(scope="module")
def kafka() -> Iterator[LocalKafka]:
    with local_kafka("tutorial", port=TEST_PORT + 3500) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def workers(kafka: LocalKafka, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Worker]]:
    base = tmp_path_factory.mktemp("tutorial")
    env = {
        "STREAMSTATE_EXTRA_PIPELINES": "pageviews",
        "PYTHONPATH": str(ROOT / "docs" / "tutorial"),
        "PROCESSING_GUARANTEE": "exactly_once",
    }
    group = [Worker(kafka, base / f"w{n}", extra_env=env).start() for n in range(2)]
    try:
        for worker in group:
            worker.wait_ready()
        yield group
    finally:
        stop_workers(group)


def post(worker: Worker, topic: str, records: list[dict[str, Any]]) -> tuple[int, Any]:
    request = urllib.request.Request(
        f"{worker.url}/topics/{topic}/records",
        data=json.dumps({"records": records}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def views(user: str, minutes: list[int]) -> list[dict[str, Any]]:
    return [
        {"key": None, "value": {"user": user, "page": f"/{m}", "ts": T0 + m * MINUTE}}
        for m in minutes
    ]


def test_the_new_topics_and_tables_are_declared_with_their_types_and_windows(
    workers: list[Worker],
) -> None:
    status, topics = workers[0].get("/topics")
    assert status == 200
    by_name = {t["name"]: t for t in topics["topics"]}
    assert by_name["page-views"] == {
        "name": "page-views",
        "value_type": "PageView",
        "key_field": "user",
        "timestamp_field": "ts",
        "tombstones": False,
    }
    assert by_name["users"]["tombstones"] is True
    status, tables = workers[0].get("/tables")
    by_table = {t["name"]: t for t in tables["tables"]}
    assert by_table["views_per_user"]["kind"] == "windowed"
    assert by_table["views_per_user"]["window"] == {"kind": "tumbling", "size_ms": 5 * MINUTE}
    assert by_table["users"]["kind"] == "global"
    assert by_table["views_per_user"]["standby_replicas"] == 1


def test_a_write_is_read_with_its_token_from_either_worker_in_its_window(
    workers: list[Worker],
) -> None:
    status, written = post(workers[0], "page-views", views("ann", [0, 1, 6]))
    assert status == 200, written
    token = written["token"]
    for worker in workers:
        query = urllib.parse.urlencode(
            {"consistent_with": token, "at": T0 + MINUTE, "timeout_ms": WAIT_MS}
        )
        status, answer = worker.get(f"/tables/views_per_user/keys/ann?{query}", HTTP_TIMEOUT)
        assert status == 200, answer
        assert answer["value"] == 2
        assert answer["window"] == {"start": T0, "end": T0 + 5 * MINUTE}
        assert "page-views" in answer["position"]["applied"]
    span = urllib.parse.urlencode(
        {"from": T0, "to": T0 + 10 * MINUTE, "consistent_with": token, "timeout_ms": WAIT_MS}
    )
    status, answer = workers[1].get(f"/tables/views_per_user/keys/ann?{span}", HTTP_TIMEOUT)
    assert [w["value"] for w in answer["windows"]] == [2, 1]


def test_the_joined_table_reads_the_global_table_and_the_token_crosses_the_repartition(
    workers: list[Worker],
) -> None:
    status, written = post(
        workers[1], "users", [{"key": None, "value": {"user": "cho", "country": "kr"}}]
    )
    assert status == 200, written
    wait_for(lambda: workers[0].get("/tables/users/keys/cho")[0] == 200, timeout=30)
    # A user's record applies from its timestamp on (now): views after it find it.
    later = (int(time.time() * 1000) + 5 * MINUTE) // (5 * MINUTE) * (5 * MINUTE)
    records = [
        {"key": None, "value": {"user": "cho", "page": f"/{m}", "ts": later + m}} for m in (1, 2)
    ]
    status, written = post(workers[1], "page-views", records)
    query = urllib.parse.urlencode(
        {"consistent_with": written["token"], "at": later, "timeout_ms": WAIT_MS}
    )
    status, answer = workers[0].get(f"/tables/views_per_country/keys/kr?{query}", HTTP_TIMEOUT)
    assert status == 200, answer
    assert answer["value"] == 2
    # the country table is fed through a repartition topic: its position names the source
    assert set(answer["position"]["applied"]) >= {"page-views"}


def test_a_bound_on_staleness_a_scan_and_a_change_stream_work_for_the_new_table(
    workers: list[Worker],
) -> None:
    status, written = post(workers[0], "page-views", views("dan", [4]))
    query = urllib.parse.urlencode(
        {"consistent_with": written["token"], "at": T0, "timeout_ms": WAIT_MS}
    )
    assert workers[0].get(f"/tables/views_per_user/keys/dan?{query}", HTTP_TIMEOUT)[0] == 200
    status, answer = workers[1].get(f"/tables/views_per_user/keys/dan?at={T0}&max_lag_records=0")
    assert status == 200, answer
    assert answer["position"]["lag_records"] == 0
    status, page = workers[1].get("/tables/views_per_user/keys?prefix=d&limit=10")
    assert status == 200
    [item] = page["items"]
    assert item["key"] == "dan"
    assert item["value"][0]["value"] == 1
    with urllib.request.urlopen(
        f"{workers[0].url}/tables/views_per_user/keys/dan/changes", timeout=10
    ) as stream:
        first = b""
        while b"\n\n" not in first:
            first += stream.readline()
    assert b"event: change" in first
    assert b'"window"' in first


def test_an_invalid_view_is_refused_over_http_and_dead_lettered_from_kafka(
    workers: list[Worker], kafka: LocalKafka
) -> None:
    status, answer = post(workers[0], "page-views", [{"key": "eve", "value": {"user": "eve"}}])
    assert status == 422
    assert answer["errors"] == [{"index": 0, "reason": "page: Field required; ts: Field required"}]
    produce(kafka.bootstrap, "page-views", [("eve", {"user": "eve", "page": "/"})])

    def dead_letters() -> list[Any]:
        return read_topic(kafka.bootstrap, "page-views-dlq")

    [dead] = wait_for(dead_letters, timeout=60)
    headers = dict(dead.headers)
    assert headers["error"] == b"ts: Field required"
    assert headers["source-topic"] == b"page-views"


def test_a_standby_answers_for_the_new_table_when_its_owner_is_gone(
    workers: list[Worker],
) -> None:
    status, written = post(workers[0], "page-views", views("fay", [0]))
    query = urllib.parse.urlencode(
        {"consistent_with": written["token"], "at": T0, "timeout_ms": WAIT_MS}
    )
    assert workers[0].get(f"/tables/views_per_user/keys/fay?{query}", HTTP_TIMEOUT)[0] == 200
    status, meta = workers[0].get("/metadata/tables/views_per_user/keys/fay")
    owner = next(w for w in workers if w.url == meta["active"])
    survivor = next(w for w in workers if w is not owner)
    assert meta["standbys"] == [survivor.url]
    time.sleep(1.0)  # the standby's flush interval
    owner.kill9()
    status, answer = survivor.get(f"/tables/views_per_user/keys/fay?at={T0}", timeout=15)
    assert status == 200, answer
    assert answer["value"] == 1
    assert answer["served_by"] == survivor.url
