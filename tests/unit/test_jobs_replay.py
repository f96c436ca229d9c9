"""The nightly job's recompute, derived from the declarations: the job's task code run in
process over a TestDriver's log gives the tables the engine built."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import pyarrow as pa
import pytest

from core.topics import partition_for
from core.values import JsonType, ValueType, parse_each
from jobs.declared import declare
from jobs.plans import REPLAY, plan_job, plan_of, silent_with
from jobs.replay import DeferredJoinRunner, PartitionReplay, Rec
from jobs.tasks import OrderError, SourceTask, new_replay
from streams import JoinWindow, Json, Topology
from streams.compile import compile_all
from streams.loading import collect
from streams.testing import TestDriver
from tables.engine import TP
from tables.pipeline import Context, RecordColumns
from tests.support.graces import WINDOWS
from tests.support.pipelines import VIEWS
from tests.support.recompute import (
    arrow,
    differing,
    driver_tables,
    job_spec,
    recompute_log,
    recomputed_tables,
    replayed,
)
from tests.support.workloads import DEMO_MODULES, click_records, demo_records, page_view_records

NOW = 1_700_000_000_000
USER_MODULE = "tests.support.pipelines"
BATCH_MODULE = "tests.support.batch_pipelines"
GRACES_MODULE = "tests.support.graces"


def test_the_demo_pipelines_replayed_give_the_engines_tables() -> None:
    driver = TestDriver(*DEMO_MODULES, partitions=4, now_ms=NOW + 3 * 3_600_000, fetch_records=300)
    demo_records(driver, seed=3, start_ms=NOW)
    batch = replayed(driver, DEMO_MODULES)
    live = driver_tables(driver, batch)
    assert differing(batch, live) == {}
    assert {name: len(rows) > 0 for name, rows in batch.items()} == {
        "word_counts": True,
        "inventory": True,
        "sales_by_category": True,
        "unsettled_sales": True,
    }


@pytest.mark.parametrize("chunks", [1, 4])
def test_a_user_topology_with_windows_a_global_join_and_a_grace_replays_exactly(
    chunks: int,
) -> None:
    driver = TestDriver(USER_MODULE, partitions=3, now_ms=NOW + 2 * 3_600_000, fetch_records=250)
    page_view_records(driver, seed=5, start_ms=NOW)
    batch = replayed(driver, [USER_MODULE], chunks=chunks, batch_rows=333)
    live = driver_tables(driver, batch)
    assert differing(batch, live) == {}
    assert set(batch) == {"views_per_user", "seconds_by_country", "sessions"}
    assert all(batch.values())
    assert driver.dead_letters(VIEWS), "the workload must exercise the dead-letter path"


def test_windows_with_a_grace_over_one_source_replay_as_the_engine_runs_them() -> None:
    """Each aggregation judges lateness by its partition's records before the record, so
    the engine's batches of one record and of a thousand, and the job's, agree."""
    runs = []
    for fetch in (1, 1000):
        driver = TestDriver(
            GRACES_MODULE, partitions=3, now_ms=NOW + 2 * 3_600_000, fetch_records=fetch
        )
        click_records(driver, seed=6, start_ms=NOW)
        runs.append(driver)
    one_by_one, large = (driver_tables(driver, WINDOWS) for driver in runs)
    assert differing(one_by_one, large) == {}
    assert all(large.values())
    for table in WINDOWS:
        assert runs[1].engine.figures.steps[f"clicks.{table}.late"] > 0, table
    for batch_rows in (1, 700):
        batch = replayed(runs[1], [GRACES_MODULE], batch_rows=batch_rows)
        assert differing(batch, large) == {}, batch_rows


def test_a_join_with_a_side_empty_in_a_partition_is_not_replayed_there_and_yields_nothing() -> None:
    driver = TestDriver("agents.settling", partitions=4, now_ms=NOW + 3_600_000)
    sale = {"store_id": "", "sku": "s", "kind": "sale", "quantity": 1, "unit_price": 1.0}
    for n in range(200):
        store = f"store-{n % 8}"
        ts = NOW + n * 60_000
        event = {**sale, "event_id": f"e{n}", "store_id": store, "ts": ts}
        driver.produce("item-events", event, key=store)
    paid = {"payment_id": "p", "sale_event_id": "e0", "store_id": "store-0", "amount": 1.0}
    driver.produce("payments", {**paid, "ts": NOW + 900 * 60_000}, key="store-0")
    driver.run()
    with_payments = {p for p in range(4) if driver.log.records.get(TP("payments", p))}
    assert len(with_payments) == 1
    declared = declare(job_spec(driver, ["agents.settling"]))
    pipeline = declared.plan.pipelines["settling.settled-sales"]
    assert silent_with(pipeline, frozenset({"payments"}))
    assert not silent_with(pipeline, frozenset({"text-lines"}))
    assert new_replay(declared, 0, 1, "item-events", frozenset({"payments"})).pipelines == []
    batch = replayed(driver, ["agents.settling"])
    live = driver_tables(driver, batch)
    assert differing(batch, live) == {}
    stores = {key for key in live["unsettled_sales"]}
    assert stores
    assert {partition_for(s.encode(), 4) for s in stores} == with_payments


def test_windows_expired_as_of_the_clock_are_not_recomputed() -> None:
    driver = TestDriver(USER_MODULE, partitions=2, now_ms=NOW + 3_600_000)
    page_view_records(driver, seed=8, start_ms=NOW, views=600)
    # Eight days on, every window is past the default retention of seven.
    driver.now_ms += 8 * 86_400_000
    batch = replayed(driver, [USER_MODULE])
    assert batch == {"views_per_user": {}, "seconds_by_country": {}, "sessions": {}}


def test_a_batch_function_without_a_recompute_is_listed_as_not_recomputed() -> None:
    plan = declare(job_spec(TestDriver(BATCH_MODULE, partitions=2), [BATCH_MODULE])).plan
    assert [(n.table, n.pipeline) for n in plan.not_recomputed] == [("balances", "balances")]
    assert REPLAY in plan.not_recomputed[0].reason
    assert set(plan.tables) == {"deposit_counts"}


def test_a_batch_function_that_declares_replay_is_replayed_over_its_topic() -> None:
    driver = TestDriver(BATCH_MODULE, partitions=3)
    for n in range(500):
        driver.produce("deposits", {"amount": n % 7}, key=f"acct-{n % 11}")
        if n % 90 == 0:
            driver.run()
    driver.produce("deposits", {"amount": "x"}, key="acct-1")
    driver.run()
    batch = replayed(driver, [BATCH_MODULE])
    assert differing(batch, driver_tables(driver, batch)) == {}
    assert sum(batch["deposit_counts"].values()) == 501


def test_records_out_of_offset_order_stop_the_task() -> None:
    declared = declare(job_spec(TestDriver(USER_MODULE, partitions=1), [USER_MODULE]))
    view = b'{"user":"u1","page":"/","ms":1,"ts":1}'
    task = SourceTask(declared)
    task.feed(arrow([Rec(VIEWS, 0, 5, b"u1", view, 1)]))
    with pytest.raises(OrderError, match="page-views"):
        task.feed(arrow([Rec(VIEWS, 0, 4, b"u1", view, 1)]))


def test_a_batch_that_raises_is_applied_record_by_record() -> None:
    topology = Topology("t")
    topology.source("in", Json).map(lambda v: 10 // v["n"]).group_by(str).count("c")
    context = Context(partitions=1, max_event_bytes=1024, window_retention_ms=1)
    loaded = collect(*compile_all([topology], context))
    send = next(p for p in loaded.pipelines if p.name.endswith("-repartition"))
    replay = PartitionReplay(0, [send], keep=send.produces)
    values = [b'{"n": 5}', b'{"n": 0}', b'{"n": 2}']
    replay.cycle({"in": [Rec("in", 0, n, None, v, 0) for n, v in enumerate(values)]})
    assert replay.figures.dead_letters == {"in": 1}
    sent = b"".join(out.value or b"" for out in replay.outputs)
    assert b'["2",1]' in sent
    assert b'["5",1]' in sent


def _joined_or_refused(order: dict[str, Any], payment: dict[str, Any] | None) -> dict[str, Any]:
    if payment is None and order["n"] % 3 == 2:
        raise ValueError(f"order {order['n']} must be paid")
    return {"n": order["n"], "paid": payment is not None}


@dataclass(frozen=True)
class BatchJson(JsonType):
    """JSON with a batch reader, as a model value type may have one."""

    name: str = "batch-json"

    def parse_many(self, raws: Sequence[bytes | None], max_bytes: int) -> list[Any]:
        return parse_each(self.parse, raws, max_bytes)


@pytest.mark.parametrize("orders_type", [Json, BatchJson()], ids=["reader", "batch-reader"])
def test_a_left_join_whose_joiner_raises_loses_those_results_only_in_order(
    orders_type: ValueType[Any],
) -> None:
    topology = Topology("t")
    orders = topology.source("orders", orders_type, key="shop", timestamp="ts")
    paid = topology.source("paid", Json, key="shop", timestamp="ts")
    window = JoinWindow(before_ms=0, after_ms=100, left_grace_ms=0, right_grace_ms=0)
    calls: Counter[tuple[int, bool]] = Counter()

    def joiner(order: dict[str, Any], payment: dict[str, Any] | None) -> dict[str, Any]:
        calls[order["n"], payment is not None] += 1
        return _joined_or_refused(order, payment)

    orders.join(
        paid,
        joiner,
        how="left",
        key=lambda o: str(o["n"]),
        other_key=lambda p: str(p["order"]),
        window=window,
        name="j",
    ).to("out")
    context = Context(partitions=1, max_event_bytes=1024, window_retention_ms=1)
    [pipeline] = collect(*compile_all([topology], context)).pipelines
    plan = plan_of(pipeline)
    assert plan is not None
    runner = DeferredJoinRunner(plan)
    replay = PartitionReplay(0, [pipeline], keep={"out"}, processes={pipeline.name: runner})

    def rec(topic: str, offset: int, value: dict[str, Any]) -> Rec:
        return Rec(topic, 0, offset, b"s", orjson.dumps({"shop": "s", **value}), value["ts"])

    orders_in = [rec("orders", n, {"n": n, "ts": n * 10}) for n in range(30)]
    orders_in.append(rec("orders", 30, {"n": 100, "ts": 10_000}))
    paid_in = [rec("paid", 0, {"order": 4, "ts": 45}), rec("paid", 1, {"order": -1, "ts": 10_000})]
    replay.cycle({"orders": orders_in[:12]})
    replay.cycle({"orders": orders_in[12:], "paid": paid_in})
    replay.finish()
    sent = [orjson.loads(out.value or b"null") for out in replay.outputs if out.topic == "out"]
    assert sent == [{"n": n, "paid": n == 4} for n in range(30) if n == 4 or n % 3 != 2], (
        "every order decided, in order, except those whose joiner raised"
    )
    assert runner.failed_pairs == 10
    assert sorted(calls) == [(n, n == 4) for n in range(30)]
    assert set(calls.values()) == {1}, "the joiner is called once per pair, also after it raised"


def test_plan_kinds_decide_each_pipelines_parallelism() -> None:
    driver = TestDriver(*DEMO_MODULES, USER_MODULE, partitions=2)
    plan = declare(job_spec(driver, [*DEMO_MODULES, USER_MODULE])).plan
    assert plan.modes["words.word_counts-repartition"] == "chunks"
    assert plan.modes["sales.sales_by_category-repartition"] == "chunks"
    # A grace needs each source partition's event time in offset order.
    assert plan.modes["pageviews.seconds_by_country-repartition"] == "partitions"
    for name in ("inventory.inventory", "settling.settled-sales", "words.word_counts"):
        assert plan.modes[name] == "partitions"
    assert plan.split_topics == {"text-lines"}
    assert [sorted(s.reads) for s in plan.stages][1] == [
        "streamstate-sales_by_category-repartition",
        "streamstate-seconds_by_country-repartition",
        "streamstate-word_counts-repartition",
    ]
    assert "sales.products" in plan.unused


def test_an_aggregation_without_merge_across_a_repartition_is_order_dependent() -> None:
    topology = Topology("t")
    topology.source("in", Json).group_by(str).aggregate("firsts", list, lambda k, v, a: [*a, v])
    context = Context(partitions=2, max_event_bytes=1024, window_retention_ms=1)
    plan = plan_job(collect(*compile_all([topology], context)))
    assert plan.tables["firsts"].order_dependent is not None
    assert "interleave" in plan.tables["firsts"].order_dependent
    assert plan.modes["t.firsts-repartition"] == "partitions"


def test_the_output_rows_name_each_window() -> None:
    driver = TestDriver(USER_MODULE, partitions=1, now_ms=NOW + 3_600_000)
    driver.produce(VIEWS, {"user": "u1", "page": "/", "ms": 1000, "ts": NOW + 61_000}, key="u1")
    driver.run()
    declared = declare(job_spec(driver, [USER_MODULE]))
    output = recompute_log(declared, driver.log.records)
    rows = [r for r in output.to_pylist() if r["kind"] == "table" and r["name"] == "sessions"]
    assert [(r["key"], r["window_start"], r["window_end"]) for r in rows] == [
        ("u1", NOW + 61_000, NOW + 61_001)
    ]
    tables = recomputed_tables(declared, output)
    ts = NOW + 61_000
    assert tables["views_per_user"] == {("u1", ts - ts % 300_000): 1}
    assert isinstance(output, pa.Table)


def test_records_held_as_columns_read_as_the_records_they_hold() -> None:
    columns = RecordColumns(
        "t", 2, [5, 6, 7], [b"a", None, b"c"], [b"1", b"2", None], [10, 11, 12], Rec
    )
    assert len(columns) == 3
    assert columns[1] == Rec("t", 2, 6, None, b"2", 11)
    assert columns[-1] == Rec("t", 2, 7, b"c", None, 12)
    assert columns[1:] == [Rec("t", 2, 6, None, b"2", 11), Rec("t", 2, 7, b"c", None, 12)]
    assert list(columns) == [columns[0], columns[1], columns[2]]
    with pytest.raises(IndexError):
        columns[3]
    with pytest.raises(ValueError, match="different lengths"):
        RecordColumns("t", 0, [1, 2], [None], [None, None], [0, 0], Rec)


def test_a_cycle_of_records_held_as_columns_refuses_and_keeps_what_a_list_does() -> None:
    """Invalid values, keys that are not the declared field and deletions are told
    apart a column at a time as they are record by record."""
    declared = declare(job_spec(TestDriver(*DEMO_MODULES, partitions=1), DEMO_MODULES))
    sale = (
        b'{"event_id":"e%d","store_id":"s1","sku":"k1","kind":"sale","quantity":2,'
        b'"unit_price":1.5,"ts":%d}'
    )
    values = [sale % (n, NOW + n) for n in range(6)]
    values[1] = b"not json"
    values[4] = b'{"event_id":"e4","store_id":"s1","kind":"sale"}'
    keys: list[bytes | None] = [b"s1"] * 6
    keys[2] = b"s2"  # not the event's store_id
    keys[3] = None
    topic = "item-events"
    stamps = [NOW] * 6
    replays = []
    for records in (
        [Rec(topic, 0, n, keys[n], values[n], stamps[n]) for n in range(6)],
        RecordColumns(topic, 0, list(range(6)), keys, values, stamps, Rec),
    ):
        replay = new_replay(declared, 0, 0, topic, frozenset({"payments"}))
        replay.cycle({topic: records})
        replay.finish()
        replays.append(replay)
    listed, held = replays
    assert listed.figures == held.figures
    assert listed.figures.dead_letters[topic] == 4
    assert list(listed.table_rows(["inventory"])) == list(held.table_rows(["inventory"]))
    assert [(o.topic, o.key, o.value) for o in listed.outputs] == [
        (o.topic, o.key, o.value) for o in held.outputs
    ]
    assert len(held.outputs) > 0
