"""The console's pure parts: the topology drawn from declarations, rates from sampled
figures, the replay log's first-claim-wins state, replay validation, the nightly report,
dead letters as the view shows them, the rebalance log, the engine's new figures, and the
page's Content Security Policy."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import html
import os
import re
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
import pytest
from starlette.testclient import TestClient

from agents.schemas import ITEM_EVENTS, TEXT_LINES
from api.console.dead_letters import DeadLetter
from api.console.members import WorkerReports
from api.console.nightly import NightlyReports, newest_report
from api.console.page import page_for
from api.console.replay_log import ReplayStates
from api.console.replays import validate
from api.console.sampler import FigureSampler, per_second
from api.console.topology import Flow, SourceLag, build, group_flow, group_lag, topic_kinds
from core.settings import Settings
from streams.loading import load
from tables.engine import TP, Engine
from tables.pipeline import Batch, Context, Pipeline, TableSpec
from tables.rebalances import RebalanceLog
from tests.support.api import make_api
from tests.unit.test_engine import Log, LogConnector, MemoryTable, run


def noop(batch: Batch) -> None:
    pass


#: Two pipelines and a repartition between them, as a word count declares itself.
SPLIT = Pipeline("split", reads=("lines",), produces=("words", "lines-dlq"), process=noop)
COUNT = Pipeline(
    "count", reads=("words",), writes=(TableSpec("counts"),), produces=("out",), process=noop
)


def test_topics_take_their_kind_from_what_the_pipelines_read_and_send() -> None:
    assert topic_kinds([SPLIT, COUNT]) == {
        "lines": "source",
        "lines-dlq": "dead-letter",
        "words": "repartition",
        "words-dlq": "dead-letter",
        "out": "output",
    }


def test_each_pipeline_is_a_step_between_its_topics_and_tables_with_rates_and_lag() -> None:
    flow = Flow(
        read={("split", "lines"): 120.0, ("count", "words"): 8.0},
        written={("count", "counts"): 30.0},
        sent={("split", "words"): 8.0, ("split", "lines-dlq"): 0.5},
    )
    graph = build([SPLIT, COUNT], {"counts": "table"}, flow, {"lines": SourceLag(42, 900)})
    nodes = {n["id"]: n for n in graph["nodes"]}
    assert nodes["step:split"]["kind"] == "step"
    assert nodes["table:counts"] == {
        "id": "table:counts",
        "kind": "table",
        "label": "counts",
        "table_kind": "table",
        "queryable": True,
    }
    assert (nodes["topic:lines"]["lag_records"], nodes["topic:lines"]["lag_ms"]) == (42, 900)
    assert nodes["topic:words"]["lag_records"] is None  # no member reported it
    edges = {(e["from"], e["to"]): e["records_per_s"] for e in graph["edges"]}
    assert edges == {
        ("topic:lines", "step:split"): 120.0,
        ("step:split", "topic:words"): 8.0,
        ("step:split", "topic:lines-dlq"): 0.5,
        ("topic:words", "step:count"): 8.0,
        ("step:count", "table:counts"): 30.0,
        ("step:count", "topic:out"): 0.0,
        ("step:count", "topic:words-dlq"): 0.0,
    }


def test_a_pipeline_with_its_own_graph_shows_its_steps_and_rates_at_its_edges() -> None:
    steps = SimpleNamespace(
        nodes=[
            SimpleNamespace(id="parse", kind="map", label="parse"),
            SimpleNamespace(id="sum", kind="aggregate", label="sum by key"),
        ],
        edges=[("topic:lines", "parse"), ("parse", "sum"), ("sum", "table:totals")],
    )
    fine = SimpleNamespace(
        name="fine", reads=("lines",), writes=(TableSpec("totals"),), produces=(), graph=steps
    )
    flow = Flow(read={("fine", "lines"): 5.0}, written={("fine", "totals"): 2.0})
    graph = build([fine], {}, flow, {})
    kinds = {n["id"]: (n["kind"], n.get("step")) for n in graph["nodes"]}
    assert kinds["step:fine/parse"] == ("step", "map")
    assert kinds["step:fine/sum"] == ("step", "aggregate")
    assert "step:fine" not in kinds
    assert kinds["table:totals"] == ("table", None)
    edges = {(e["from"], e["to"]): e["records_per_s"] for e in graph["edges"]}
    assert edges == {
        ("topic:lines", "step:fine/parse"): 5.0,
        ("step:fine/parse", "step:fine/sum"): None,
        ("step:fine/sum", "table:totals"): 2.0,
    }


def test_a_global_table_is_drawn_as_one_fed_by_its_topic() -> None:
    from streams import Json, Topology
    from streams.compile import compile_all
    from streams.loading import collect
    from tables.pipeline import Context

    topology = Topology("shop")
    customers = topology.global_table("customer-updates", Json, key="id", name="customers")
    orders = topology.source("orders", Json, key="customer")
    joined = orders.join(customers, lambda order, customer: order, key=lambda o: o["customer"])
    joined.group_by_key().count("orders_per_customer")
    orders.join(customers, lambda order, customer: 1, key=lambda o: o["customer"]).to("out")
    context = Context(partitions=1, max_event_bytes=1024, window_retention_ms=1)
    pipelines = collect(*compile_all([topology], context)).pipelines
    kinds = {"customers": "global", "orders_per_customer": "table"}
    graph = build(pipelines, kinds, Flow(), {})
    nodes = {n["id"]: n for n in graph["nodes"]}
    table = nodes["table:customers"]
    assert (table["kind"], table["table_kind"], table["queryable"]) == ("table", "global", True)
    fed = [e for e in graph["edges"] if e["to"] == "table:customers"]
    assert fed == [
        {
            "from": "topic:customer-updates",
            "to": "table:customers",
            "records_per_s": None,
            "pipeline": "global",
        }
    ]
    assert nodes["topic:customer-updates"]["kind"] == "source"


def test_the_group_figures_add_up_the_members_rates_and_lag() -> None:
    def report(rate: float, lag: int, age: int) -> dict[str, Any]:
        return {
            "rates": {
                "read": [{"pipeline": "split", "topic": "lines", "per_s": rate}],
                "written": [],
                "sent": [],
            },
            "sources": [{"topic": "lines", "partition": 0, "lag_records": lag, "lag_ms": age}],
        }

    reports = [report(10.0, 5, 100), report(2.5, 7, 300)]
    assert group_flow(reports).read == {("split", "lines"): 12.5}
    assert group_lag(reports) == {"lines": SourceLag(12, 300)}


def test_rates_come_from_the_samples_about_a_window_apart() -> None:
    figures = SimpleNamespace(read=Counter[tuple[str, str]](), written=Counter(), sent=Counter())
    figures.cycles = 0
    sampler = FigureSampler(lambda: figures, window_s=5.0)
    for second in range(11):
        figures.read[("p", "t")] = 100 * second
        sampler.sample(now=float(second), wall=1000.0 + second)
    flow = sampler.flow()
    assert flow.seconds == 5.0
    assert flow.read == {("p", "t"): 100.0}
    history = sampler.history(points=3)
    assert [point["read"] for point in history] == [100.0, 100.0, 100.0]
    assert [point["at"] for point in history] == [1008.0, 1009.0, 1010.0]


def test_a_total_that_went_down_counts_from_zero() -> None:
    assert per_second(Counter({("p", "t"): 30}), Counter({("p", "t"): 500}), 2.0) == {
        ("p", "t"): 15.0
    }


def test_the_first_claim_of_a_dead_letter_wins_and_only_its_outcome_counts() -> None:
    states = ReplayStates()
    states.apply("d/0/1", {"claim": "a", "status": "claimed", "by": "w1"}, 0)
    states.apply("d/0/1", {"claim": "b", "status": "claimed", "by": "w2"}, 1)
    states.apply("d/0/1", {"claim": "a", "status": "replayed", "by": "w1"}, 2)
    states.apply("d/0/1", {"claim": "b", "status": "replayed", "by": "w2"}, 3)
    assert states.won("d/0/1", "a")
    assert not states.won("d/0/1", "b")
    entry = states.get("d/0/1")
    assert entry is not None
    assert (entry["status"], entry["by"], entry["log_offset"]) == ("replayed", "w1", 0)
    assert states.position == 4
    assert states.get("d/0/2") is None


def test_a_compacted_log_that_kept_only_an_outcome_still_refuses_the_dead_letter() -> None:
    states = ReplayStates()
    states.apply("d/0/1", {"claim": "a", "status": "replayed", "by": "w1"}, 7)
    assert states.get("d/0/1") is not None


def test_a_replay_is_validated_as_the_produce_endpoint_validates() -> None:
    context = Context(8, max_event_bytes=65536, window_retention_ms=0)
    sources = load(Settings().pipeline_modules, context).sources
    items, lines = sources[ITEM_EVENTS], sources[TEXT_LINES]
    event = orjson.dumps(
        {
            "event_id": "e-1",
            "store_id": "store-1",
            "sku": "sku-1",
            "kind": "sale",
            "quantity": 2,
            "unit_price": 1.5,
            "ts": 1_700_000_000_000,
        }
    )
    assert validate(items, b"store-1", event, 65536) == (b"store-1", None)
    assert validate(items, None, event, 65536) == (b"store-1", None)
    key, reason = validate(items, b"store-1", b"not json", 65536)
    assert key == b"store-1"
    assert reason is not None
    assert "JSON" in reason  # the reason the stream gives its dead letter
    _, reason = validate(items, b"store-2", event, 65536)
    assert reason is not None
    assert "store_id" in reason
    assert validate(lines, None, b"123", 65536) == (None, None)  # any text is a line
    _, reason = validate(lines, None, b"\xff\xfe", 65536)
    assert reason is not None
    assert "not UTF-8" in reason
    assert validate(None, b"k", b"\x00", 10) == (b"k", None)


def test_the_newest_nightly_report_is_summarized_per_table(tmp_path: Path) -> None:
    reports = NightlyReports(tmp_path)
    empty = reports.latest()
    assert empty["report"] is None
    assert str(tmp_path) in empty["detail"]
    older, newer = tmp_path / "20261125T020000Z", tmp_path / "20261126T020000Z"
    for run_dir in (older, newer):
        run_dir.mkdir()
    (older / "report.json").write_bytes(orjson.dumps({"tables": {}}))
    report = {
        "cut_taken_at_ms": 1_795_000_000_000,
        "seconds": 41.5,
        "cut_settled": True,
        "corrections_published": 3,
        "tables": {
            "t1": {
                "keys_compared": 10,
                "mismatched": 2,
                "missing_in_stream": 1,
                "missing_in_batch": 0,
                "examples": [{"key": "k", "status": "mismatched", "batch": 1, "stream": 2}],
                "corrections_published": 3,
            },
            "t2": {"reason": "written by a batch function"},
        },
    }
    (newer / "report.json").write_bytes(orjson.dumps(report))
    os.utime(older / "report.json", (1, 1))
    assert newest_report(tmp_path) == newer / "report.json"
    summary = reports.latest()["report"]
    assert summary["ran_at"] == 1_795_000_000_000
    assert summary["seconds"] == 41.5
    assert summary["differs"] is True
    [t1, t2] = summary["tables"]
    assert (t1["keys_compared"], t1["differing"], t1["repaired"]) == (10, 3, 3)
    assert t2 == {"name": "t2", "recomputed": False}


@pytest.mark.parametrize("found", [[], [{"tables": {}}], {"seconds": 3}, {"tables": []}, "x"])
def test_a_report_file_that_is_no_nightly_report_is_said_to_be_none(
    tmp_path: Path, found: object
) -> None:
    run_dir = tmp_path / "20261126T020000Z"
    run_dir.mkdir()
    (run_dir / "report.json").write_bytes(orjson.dumps(found))
    latest = NightlyReports(tmp_path).latest()
    assert latest["report"] is None
    assert latest["detail"].endswith(
        "is not a nightly report: a JSON object with its tables is expected"
    )


def test_a_dead_letter_applied_by_other_pipelines_is_not_replayed_to_them_unasked() -> None:
    from api.console.replays import AppliedElsewhere, Replayer, Wanted

    def letter(offset: int, *failed: tuple[str, bytes]) -> DeadLetter:
        headers = [("error", b"processing failed: ValueError: x"), ("source-topic", b"in")]
        record = SimpleNamespace(
            topic="in-dlq", partition=0, offset=offset, timestamp=1, key=b"k", value=b"v",
            headers=[*headers, *failed],
        )  # fmt: skip
        return DeadLetter.of(record)

    readers = {"in": ["t.counts", "t.sums-repartition"], "other": ["t.counts"]}
    replayer = Replayer(
        "127.0.0.1:9",
        None,
        {"in-dlq": "in"},
        {},
        1,
        1024,
        "http://w",
        readers,  # type: ignore[arg-type]
    )
    wanted = [Wanted("in-dlq", 0, 3), Wanted("in-dlq", 0, 4)]
    refused_at_the_source = letter(3)  # no pipeline applied it
    one_failed = letter(4, ("failed-pipeline", b"t.sums-repartition"))
    with pytest.raises(AppliedElsewhere) as raised:
        replayer._check_not_applied(wanted, [refused_at_the_source, one_failed])
    assert raised.value.status == 409
    assert raised.value.detail == (
        "in-dlq/0/4: only pipeline t.sums-repartition failed on this record; t.counts applied "
        "it, and a replay to in would apply it to them again. Nothing was replayed; send "
        '"apply_to_all": true to replay it all the same.'
    )
    # The only reader failed: nothing else applied it.
    replayer.readers["in"] = ("t.sums-repartition",)
    replayer._check_not_applied(wanted, [refused_at_the_source, one_failed])


def test_a_dead_letter_shows_text_or_base64_and_says_when_it_is_cut() -> None:
    record = SimpleNamespace(
        topic="t-dlq",
        partition=1,
        offset=9,
        timestamp=5,
        key=b"\xff\x00",
        value=("é" * 2000).encode(),
        headers=[("error", b"bad"), ("source-topic", b"t"), ("source-partition", b"1")],
    )
    shown = DeadLetter.of(record, preview=101).as_dict()
    assert shown["key"] == {
        "text": None,
        "base64": base64.b64encode(b"\xff\x00").decode(),
        "bytes": 2,
        "truncated": False,
    }
    assert shown["value"]["text"] == "é" * 50  # the cut split the 51st character
    assert (shown["value"]["bytes"], shown["value"]["truncated"]) == (4000, True)
    assert shown["error"] == "bad"
    assert shown["source"] == {"topic": "t", "partition": 1, "offset": None}


def test_the_rebalance_log_records_the_join_and_the_pause() -> None:
    log = RebalanceLog(keep=2)
    app = SimpleNamespace(consumer_generation_id=7)
    for _ in range(3):
        state = log.on_rebalance_start(app)
        log.on_rebalance_return(app, state)
        log.on_rebalance_end(app, state)
    running = log.on_rebalance_start(app)
    kept = log.last()
    assert [r["number"] for r in kept] == [4, 3]
    assert kept[0]["in_progress"] is True
    assert kept[1]["in_progress"] is False
    assert kept[1]["generation"] == 7
    assert 0 <= kept[1]["join_s"] <= kept[1]["paused_s"]
    log.on_rebalance_end(app, running)
    assert log.last()[0]["in_progress"] is False


def test_the_engine_counts_reads_writes_and_sends_per_pipeline() -> None:
    def process(batch: Batch) -> None:
        table = batch.table("t")
        for record in batch.of("in"):
            if record.value == b"poison":
                raise ValueError("poison")
            assert record.value is not None
            table.put(record.value, 1)
            batch.send("out", record.value, b"seen", partition=0)

    log, table = Log(), MemoryTable("t")
    for value in [b"a", b"b", b"a", b"poison"]:
        log.append(TP("in", 0), None, value)
    connector = LogConnector(log, exactly_once=True)
    pipeline = Pipeline("p", reads=("in",), writes=(TableSpec("t"),), process=process)
    engine = Engine(
        [pipeline], {"t": table}, connector, partitions=1, exactly_once=connector.exactly_once
    )
    run(engine, connector, limit=10)
    figures = engine.figures
    assert figures.read == Counter({("p", "in"): 3})
    assert figures.written == Counter({("p", "t"): 3})  # one record at a time after the poison
    assert figures.sent == Counter({("p", "out"): 3, ("p", "in-dlq"): 1})


def test_the_console_page_allows_its_import_map_and_nothing_from_another_host() -> None:
    client = TestClient(make_api())
    redirect = client.get("/ui", follow_redirects=False)
    assert (redirect.status_code, redirect.headers["location"]) == (307, "ui/")
    page = client.get("/ui/")
    assert page.status_code == 200
    policy = page.headers["content-security-policy"]
    [import_map] = re.findall(r'<script type="importmap">(.*?)</script>', page.text, re.DOTALL)
    [early] = re.findall(r"<script>(.*?)</script>", page.text, re.DOTALL)
    [sources] = re.findall(r"script-src ([^;]*)", policy)
    digests = {
        f"'sha256-{base64.b64encode(hashlib.sha256(s.encode()).digest()).decode()}'"
        for s in (import_map, early)
    }
    assert set(sources.split()) == {"'self'", *digests}
    assert "connect-src 'self'" in policy
    assert "default-src 'none'" in policy
    for path in orjson.loads(import_map)["imports"].values():
        assert client.get("/ui/" + path.removeprefix("./")).status_code == 200, path
    required = '<meta name="streamstate-token-required" content="{}">'
    assert required.format("false") in page.text
    assert required.format("true") in TestClient(make_api(token="s3cret")).get("/ui/").text
    # the table the tables view opens with (none here: this worker serves no table yet)
    listed = [t["name"] for t in client.get("/tables").json()["tables"]]
    first = html.escape(listed[0]) if listed else ""
    assert f'<meta name="streamstate-first-table" content="{first}">' in page.text


def test_the_page_names_the_first_table_escaped_and_the_token_requirement() -> None:
    page = '<meta a content="TOKEN_REQUIRED"><meta b content="FIRST_TABLE">'
    served = page_for(page, token_required=True, first_table='a"<b>&c')
    assert served == '<meta a content="true"><meta b content="a&quot;&lt;b&gt;&amp;c">'


VIEW_NAMES = ("topology", "group", "tables", "dead-letters", "nightly")


def _static_imports(folder: Path, module: str, import_map: dict[str, str]) -> set[str]:
    """``module`` (a path under ``folder``) and every module it imports statically, as
    paths under ``folder``: what the browser must load before the module runs."""
    found: set[str] = set()
    waiting = [module]
    while waiting:
        current = waiting.pop()
        if current in found:
            continue
        found.add(current)
        text = (folder / current).read_text()
        for name in re.findall(r'^import [^;]*?from "([^"]+)";', text, re.MULTILINE | re.DOTALL):
            if name in import_map:
                target = import_map[name].removeprefix("./assets/")
            else:
                target = (Path(current).parent / name).as_posix()
                target = str(Path(os.path.normpath(target)))
            waiting.append(target)
    return found


def test_the_page_preloads_the_modules_of_the_view_it_opens_and_no_other_view() -> None:
    folder = Path(__file__).resolve().parents[2] / "api" / "console" / "assets"
    page = (folder / "index.html").read_text()
    [import_map] = re.findall(r'<script type="importmap">(.*?)</script>', page, re.DOTALL)
    imports = orjson.loads(import_map)["imports"]
    [shared] = re.findall(r"const SHARED = \[(.*?)\];", page, re.DOTALL)
    shared_modules = set(re.findall(r'"([^"]+)"', shared))
    [views] = re.findall(r"const VIEWS = \{.*?\n(.*?)\n  \};", page, re.DOTALL)
    per_view = {
        name: set(re.findall(r'"([^"]+\.js)"', rest))
        for name, rest in re.findall(r'^\s*"?([\w-]+)"?: \[(.*)\],$', views, re.MULTILINE)
    }
    app = (folder / "js" / "app.js").read_text()
    opened = dict(re.findall(r'\["([\w-]+)", "[^"]+", \(\) => import\("\./([^"]+)"\)', app))
    assert set(per_view) == set(opened) == set(VIEW_NAMES)
    app_needs = _static_imports(folder, "js/app.js", imports) - {"js/app.js"}
    for view, module in opened.items():
        preloaded = shared_modules | per_view[view]
        needed = app_needs | _static_imports(folder, f"js/{module}", imports)
        assert needed <= preloaded, (view, needed - preloaded)
        others = {f"js/{m}" for v, m in opened.items() if v != view}
        assert not preloaded & others, (view, preloaded & others)
    assert "vendor/dagre/dagre.esm.js" in per_view["topology"]  # imported when it draws
    for path in shared_modules.union(*per_view.values()):
        assert (folder / path).is_file(), path


def test_the_console_routes_want_the_token_when_one_is_set() -> None:
    client = TestClient(make_api(token="s3cret"))
    internal = ("/internal/console/worker", "/internal/console/flow")
    for path in ("/topology", "/group", "/dead-letters", "/nightly", *internal):
        assert client.get(path).status_code == 401, path
    answer = client.post("/dead-letters/replay", json={"records": []})
    assert answer.status_code == 401


def test_a_replay_body_is_read_as_produce_reads_one() -> None:
    client = TestClient(make_api(token="s3cret"))
    auth = {"Authorization": "Bearer s3cret"}
    body = b'{"records": [{"topic": "text-lines-dlq", "partition": -1, "offset": 0}]}'
    # without the token nothing is looked at, whatever the body
    answer = client.post(
        "/dead-letters/replay", content=b"x", headers={"content-type": "text/plain"}
    )
    assert answer.status_code == 401
    answer = client.post(
        "/dead-letters/replay", content=body, headers={**auth, "content-type": "text/plain"}
    )
    assert answer.status_code == 415, answer.text
    assert answer.json()["detail"].startswith("Content-Type 'text/plain': the body must be JSON")
    # no type at all: read as JSON (here FastAPI's own 422 for the negative partition)
    answer = client.post("/dead-letters/replay", content=body, headers=auth)
    assert answer.status_code == 422, answer.text
    assert "partition" in answer.text
    answer = client.post(
        "/dead-letters/replay",
        content=b"[" * 5000 + b"]" * 5000,
        headers={**auth, "content-type": "application/json"},
    )
    assert answer.status_code == 422, answer.text
    assert answer.json() == {"detail": "body: JSON nested too deeply to be read"}


def test_the_flow_report_has_the_rates_and_sources_the_topology_needs_and_no_copies() -> None:
    client = TestClient(make_api())
    flow = client.get("/internal/console/flow").json()
    whole = client.get("/internal/console/worker").json()
    assert flow["url"] == whole["url"]
    assert flow["rates"] is not None
    assert flow["rates"].keys() == whole["rates"].keys()
    assert flow["sources"] == whole["sources"]
    assert flow["copies"] == []  # left out, not gathered
    assert client.get("/topology").json()["members"] == 1


def test_the_topology_asks_a_peer_without_the_flow_report_for_its_whole_report() -> None:
    asked: list[tuple[str, str]] = []

    class Peers:
        async def get(self, url: str, path: str, params: Any, purpose: str) -> Any:
            asked.append((url, path))
            if url == "http://c":
                return None  # unreachable
            status = 404 if (url, path) == ("http://b", "/internal/console/flow") else 200
            return SimpleNamespace(status=status, body={"url": url, "reachable": True})

    routing = SimpleNamespace(peers=lambda: ["http://b", "http://c"], own_url="http://a")
    queries = SimpleNamespace(routing=routing, peers=Peers())
    reports = WorkerReports(None, queries, None, None, None)  # type: ignore[arg-type]
    reports.flow = lambda: {"url": "http://a", "reachable": True}  # type: ignore[method-assign]
    found = asyncio.run(reports.group_flows())
    assert found == [
        {"url": "http://a", "reachable": True},
        {"url": "http://b", "reachable": True},
        {"url": "http://c", "reachable": False, "status": "unreachable"},
    ]
    assert sorted(asked) == [
        ("http://b", "/internal/console/flow"),
        ("http://b", "/internal/console/worker"),
        ("http://c", "/internal/console/flow"),
    ]
