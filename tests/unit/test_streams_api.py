"""The streams API, run in the test driver: steps, outputs, dead letters, aggregations,
windows, joins, and the mistakes a declaration can make."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from typing import Any

import orjson
import pytest
from pydantic import BaseModel

from core.topics import partition_for
from streams import (
    Hopping,
    JoinWindow,
    Json,
    Model,
    Session,
    Text,
    Topology,
    TopologyError,
    Tumbling,
)
from streams.compile import repartition_topic, state_table
from streams.testing import TestDriver
from tests.support.graces import CLICKS, WINDOWS, clicks_topology

T0 = 1_700_000_000_000
MINUTE = 60_000


class View(BaseModel):
    user: str
    page: str
    ts: int


class Account(BaseModel):
    user: str
    plan: str


def view(user: str, ts: int, page: str = "/") -> dict[str, Any]:
    return {"user": user, "page": page, "ts": ts}


def views_topology() -> tuple[Topology, Any]:
    topology = Topology("views")
    return topology, topology.source("views", Model(View), key="user", timestamp="ts")


# -- stateless steps and outputs ---------------------------------------------------------


def test_map_filter_flat_map_and_branch_reach_their_outputs_keyed_as_declared() -> None:
    topology = Topology("t")
    lines = topology.source("lines", Text)
    words = lines.flat_map(str.split, value_type=Text).map(str.upper, value_type=Text)
    short, long_ = words.filter(lambda w: w != "THE").branch(lambda w: len(w) <= 3)
    short.to("short", key=lambda w: w)
    long_.to("long", key=lambda w: w[0], value=lambda w: {"word": w})
    driver = TestDriver(topology, partitions=3)
    driver.produce("lines", "the fox jumps over the dog")
    driver.run()
    assert sorted(r.value for r in driver.outputs("short")) == [b"DOG", b"FOX"]
    long_words = driver.outputs("long")
    assert sorted(r.json()["word"] for r in long_words) == ["JUMPS", "OVER"]
    for record in long_words:  # keyed records go to their key's partition
        assert record.key is not None
        assert record.partition == partition_for(record.key, 3)


def test_outputs_keep_the_record_timestamp_of_their_source_record() -> None:
    topology, views = views_topology()
    views.map(lambda v: v.page, value_type=Text).to("pages")
    driver = TestDriver(topology, partitions=2)
    driver.produce("views", view("ann", T0 + 5 * MINUTE), key="ann", timestamp=T0 - 1)
    driver.run()
    [page] = driver.outputs("pages")
    assert (page.key, page.value, page.timestamp) == (b"ann", b"/", T0 - 1)


def test_each_output_keeps_its_own_records_timestamp_whatever_the_batch() -> None:
    topology = Topology("t")
    topology.source("events", Json).filter(lambda n: n != 1).to("out")
    stamps = [T0 - 10_000, T0 - 1_000, T0 - 5_000, T0 - 7_000]
    for fetch in (1000, 1):
        driver = TestDriver(topology, partitions=1, fetch_records=fetch)
        for n, stamp in enumerate(stamps):
            driver.produce("events", n, timestamp=stamp)
        driver.run()
        assert [o.timestamp for o in driver.outputs("out")] == [stamps[0], *stamps[2:]]


def test_key_by_then_group_by_key_groups_by_the_new_key_through_a_repartition() -> None:
    topology = Topology("t")
    words = topology.source("words", Text)
    words.key_by(lambda w: w[0]).group_by_key().count("by_initial")
    sales = topology.source("sales", Json)
    sales.key_by(lambda s: s["shop"], name="by_shop").group_by_key().aggregate(
        "items", list, lambda shop, sale, items: [*items, sale["item"]]
    )
    driver = TestDriver(topology, partitions=3, now_ms=T0)
    for word in ("apple", "avocado", "banana", "cherry", "apricot"):
        driver.produce("words", word)
    for n, shop in enumerate(("s1", "s2", "s1")):
        driver.produce("sales", {"shop": shop, "item": f"i{n}"})
    driver.run()
    assert driver.table("by_initial") == {"a": 3, "b": 1, "c": 1}
    assert driver.table("items") == {"s1": ["i0", "i2"], "s2": ["i1"]}
    assert not driver.dead_letters("words")
    assert not driver.dead_letters("sales")


def test_invalid_records_go_to_the_dead_letter_topic_with_the_reason_once() -> None:
    topology, views = views_topology()
    views.group_by_key().count("per_user")
    views.to("copy")
    driver = TestDriver(topology, partitions=1)
    driver.produce("views", view("ann", T0), key="ann")
    driver.produce("views", b"{not json", key="ann")
    driver.produce("views", view("bob", T0), key="ann")
    driver.produce("views", {"user": "ann", "page": "/"}, key="ann")
    driver.run()
    reasons = [d.reason for d in driver.dead_letters("views")]
    assert len(reasons) == 3  # two pipelines read the topic: each record reported once
    assert "Invalid JSON" in reasons[0]
    assert reasons[1] == "key: 'ann' does not match user 'bob'"
    assert reasons[2] == "ts: Field required"
    assert [d.source_offset for d in driver.dead_letters("views")] == [1, 2, 3]
    assert driver.table("per_user") == {"ann": 1}
    assert len(driver.outputs("copy")) == 1


def test_a_record_whose_step_raises_is_dead_lettered_and_the_rest_take_effect() -> None:
    topology = Topology("t")
    numbers = topology.source("numbers", Json)
    numbers.map(lambda n: 100 // n, name="divide").group_by(lambda n: "all").sum("total")
    driver = TestDriver(topology, partitions=1)
    driver.produce_many("numbers", [1, 2, 0, 4, 5])
    driver.run()
    assert driver.table("total") == {"all": 100 + 50 + 25 + 20}
    [dead] = driver.dead_letters("numbers")
    assert dead.value == b"0"
    assert dead.reason == "processing failed: ZeroDivisionError: integer division or modulo by zero"


def test_an_aggregate_with_no_json_encoding_dead_letters_its_records_and_the_rest_apply() -> None:
    topology = Topology("t")
    numbers = topology.source("numbers", Json)
    numbers.group_by_key().aggregate(
        "seen", list, lambda key, n, seen: set(seen) | {n} if key == "odd" else [*seen, n]
    )
    driver = TestDriver(topology, partitions=1)
    for n in (1, 2, 3, 4):
        driver.produce("numbers", n, key="odd" if n % 2 else "even")
    driver.run()  # the worker would have stopped here: the table value is a set
    assert driver.table("seen") == {"even": [2, 4]}
    dead = driver.dead_letters("numbers")
    assert [d.value for d in dead] == [b"1", b"3"]
    for letter in dead:
        assert letter.reason == (
            "processing failed: TableValueError: table seen, key 'odd': the value has no "
            "JSON encoding (Type is not JSON serializable: set)"
        )
    driver.produce("numbers", 6, key="even")
    driver.run()
    assert driver.table("seen") == {"even": [2, 4, 6]}


def test_a_record_whose_event_time_field_is_wrong_is_dead_lettered_once_with_the_reason() -> None:
    topology = Topology("t")
    events = topology.source("events", Json, key="k", timestamp="t")
    events.group_by_key().count("counts")
    events.group_by_key().window_by(Tumbling(60_000)).count("per_minute")
    driver = TestDriver(topology, partitions=1, now_ms=T0)
    wrong = [
        {"k": "a"},
        {"k": "a", "t": "soon"},
        {"k": "a", "t": None},
        {"k": "a", "t": 1.5e300},
        b'{"k": "a", "t": 100000000000000000000}',
    ]
    for value in [{"k": "a", "t": T0}, *wrong, {"k": "a", "t": float(T0 + 1)}]:
        driver.produce("events", value, key="a")
    driver.run()
    assert driver.table("counts") == {"a": 2}
    assert [w["value"] for w in driver.windows("per_minute", "a")] == [2]
    assert [d.reason for d in driver.dead_letters("events")] == [
        "t: Field required",
        "t: the event time must be whole milliseconds, not 'soon'",
        "t: the event time must be whole milliseconds, not None",
        "t: the event time 1.5e+300 ms is out of range (0 to 253402300799999)",
        "t: the event time 1e+20 ms is out of range (0 to 253402300799999)",
    ]


def test_grouping_json_values_by_themselves_dead_letters_those_that_are_not_text() -> None:
    topology = Topology("t")
    topology.source("things", Json).group_by().count("counts")
    driver = TestDriver(topology, partitions=2)
    driver.produce_many("things", [b'"a"', {"k": 1}, b'"b"', b'"a"'])
    driver.run()
    assert driver.table("counts") == {"a": 2, "b": 1}
    [dead] = driver.dead_letters("things")
    assert dead.reason == (
        "processing failed: TypeError: group_by() without a key groups by the value, which "
        "must be text, not dict: give group_by a key function"
    )


# -- aggregations ------------------------------------------------------------------------


def test_counts_cross_the_repartition_topic_combined_per_batch() -> None:
    topology = Topology("t")
    topology.source("lines", Text).flat_map(str.split, value_type=Text).group_by().count("words")
    driver = TestDriver(topology, partitions=4, fetch_records=1000)
    driver.produce_many("lines", ["a b a", "b c", "a"] * 100)
    driver.run()
    assert driver.table("words") == {"a": 300, "b": 200, "c": 100}
    topic = repartition_topic("streamstate", "words")
    data = [r for r in driver.outputs(topic)]
    items = [item for r in data for item in orjson.loads(r.value or b"{}")["combined"]]
    # combined: far fewer items than the 600 words, each in its key's partition
    assert len(items) < 60
    for record in data:
        for key, _count in orjson.loads(record.value or b"{}")["combined"]:
            assert record.partition == partition_for(key.encode(), 4)


def test_sum_reduce_and_aggregate_with_merge_agree_with_a_plain_fold() -> None:
    topology = Topology("t")
    sales = topology.source("sales", Json)
    sales.group_by(lambda s: s["shop"]).sum("revenue", lambda s: s["amount"])
    sales.group_by(lambda s: s["shop"], name="by_shop").reduce(
        "largest", lambda a, b: a if a["amount"] >= b["amount"] else b
    )
    sales.group_by(lambda s: s["shop"], name="stats").aggregate(
        "stats",
        lambda: {"n": 0, "items": []},
        lambda shop, s, agg: {"n": agg["n"] + 1, "items": sorted([*agg["items"], s["item"]])},
        merge=lambda shop, a, b: {"n": a["n"] + b["n"], "items": sorted(a["items"] + b["items"])},
    )
    records = [{"shop": f"s{i % 3}", "amount": i, "item": f"i{i}"} for i in range(60)]
    driver = TestDriver(topology, partitions=4, fetch_records=7)
    driver.produce_many("sales", records)
    driver.run()
    assert driver.table("revenue") == {f"s{k}": sum(range(k, 60, 3)) for k in range(3)}
    largest = driver.table("largest")
    assert {shop: v["amount"] for shop, v in largest.items()} == {"s0": 57, "s1": 58, "s2": 59}
    stats = driver.table("stats")
    assert stats["s1"] == {"n": 20, "items": sorted(f"i{i}" for i in range(1, 60, 3))}


def test_reduce_keeps_model_values_as_their_json_across_batches_and_repartitions() -> None:
    topology, views = views_topology()
    latest = lambda a, b: a if a.ts >= b.ts else b  # noqa: E731
    views.group_by(lambda v: v.page).reduce("latest_by_page", latest)  # a repartition
    views.group_by_key().reduce("latest_by_user", latest)  # none
    views.group_by_key().window_by(Session(gap=10 * MINUTE)).reduce("latest_in_session", latest)
    driver = TestDriver(topology, partitions=4, fetch_records=3, now_ms=T0 + 60 * MINUTE)
    records = [view(f"u{i % 3}", T0 + (i * 7 % 20) * MINUTE, f"/p{i % 2}") for i in range(20)]
    for record in records:
        driver.produce("views", record, key=record["user"])
        driver.run()
    last = {}
    for record in records:
        for key in (record["page"], record["user"]):
            if key not in last or record["ts"] > last[key]["ts"]:
                last[key] = record
    assert driver.table("latest_by_page") == {p: last[p] for p in ("/p0", "/p1")}
    assert driver.table("latest_by_user") == {u: last[u] for u in ("u0", "u1", "u2")}
    for user in ("u0", "u1", "u2"):
        sessions = driver.windows("latest_in_session", user)
        assert sessions
        assert all(isinstance(s["value"], dict) for s in sessions)
        assert max(s["value"]["ts"] for s in sessions) == last[user]["ts"]
    assert not driver.dead_letters("views")


def test_an_aggregate_without_merge_folds_each_value_in_order_of_its_partition() -> None:
    topology = Topology("t")
    events = topology.source("events", Json)
    events.group_by(lambda e: e["key"]).aggregate(
        "history", list, lambda key, e, seen: [*seen, e["n"]]
    )
    driver = TestDriver(topology, partitions=3, fetch_records=4)
    for n in range(30):
        driver.produce("events", {"key": "k", "n": n}, partition=0)
    driver.run()
    assert driver.table("history") == {"k": list(range(30))}


def test_grouping_by_the_record_key_needs_no_repartition_and_a_keyless_record_is_refused() -> None:
    topology, views = views_topology()
    views.group_by_key().aggregate("pages", list, lambda user, v, pages: [*pages, v.page])
    raw = Topology("raw")
    raw.source("plain", Json).group_by_key().count("per_key")
    driver = TestDriver(topology, raw, partitions=2)
    for n in range(4):
        driver.produce("views", view("ann", T0 + n, f"/{n}"), key="ann")
    driver.produce("plain", {"x": 1}, key="k")
    driver.produce("plain", {"x": 2})
    driver.run()
    assert driver.table("pages") == {"ann": ["/0", "/1", "/2", "/3"]}
    assert not [p for p in driver.pipelines if "repartition" in p.name]
    assert driver.table("per_key") == {"k": 1}
    [dead] = driver.dead_letters("plain")
    assert dead.reason == "key: missing; per_key groups records by their key"


# -- windows ---------------------------------------------------------------------------------


def test_tumbling_windows_count_by_event_time_and_expire_on_the_wall_clock() -> None:
    topology, views = views_topology()
    views.group_by_key().window_by(Tumbling(5 * MINUTE, retention=60 * MINUTE)).count("per_5m")
    driver = TestDriver(topology, partitions=2, now_ms=T0 + 10 * MINUTE)
    for ts in (T0, T0 + MINUTE, T0 + 6 * MINUTE):
        driver.produce("views", view("ann", ts), key="ann")
    driver.run()
    start = T0 - T0 % (5 * MINUTE)
    assert driver.windows("per_5m", "ann") == [
        {"start": start, "end": start + 5 * MINUTE, "value": 2},
        {"start": start + 5 * MINUTE, "end": start + 10 * MINUTE, "value": 1},
    ]
    driver.advance(55 * MINUTE)  # the first window ended more than an hour ago
    driver.produce("views", view("ann", T0), key="ann")  # in it: too old, not counted
    driver.produce("views", view("bob", T0 + 64 * MINUTE), key="bob")
    driver.run()
    assert [w["value"] for w in driver.windows("per_5m", "ann")] == [1]
    assert driver.engine.figures.steps["views.per_5m.expired"] == 1


def test_a_window_past_its_retention_is_not_read_though_its_partition_is_idle() -> None:
    topology, views = views_topology()
    hour = timedelta(hours=1)
    views.group_by_key().window_by(Tumbling(timedelta(minutes=1), retention=hour)).count("w")
    driver = TestDriver(topology, partitions=2, now_ms=T0)
    driver.produce("views", view("ann", T0), key="ann")
    driver.run()
    assert len(driver.windows("w", "ann")) == 1
    driver.advance(2 * 3_600_000)
    driver.run()  # nothing reaches ann's partition: nothing removes the window yet
    assert driver.windows("w", "ann") == []
    assert driver.table("w") == {}


def test_hopping_windows_hold_each_record_in_every_window_that_covers_it() -> None:
    topology, views = views_topology()
    views.group_by(lambda v: v.page).window_by(Hopping(10 * MINUTE, 5 * MINUTE)).count("pages")
    driver = TestDriver(topology, partitions=2, now_ms=T0 + MINUTE)
    base = T0 - T0 % (10 * MINUTE)
    driver.produce("views", view("ann", base + 7 * MINUTE, "/a"), key="ann")
    driver.run()
    starts = [w["start"] - base for w in driver.windows("pages", "/a")]
    assert starts == [0, 5 * MINUTE]


def test_session_windows_grow_and_merge_across_batches() -> None:
    topology, views = views_topology()
    views.group_by_key().window_by(Session(gap=10 * MINUTE)).count("sessions")
    driver = TestDriver(topology, partitions=1, now_ms=T0 + 120 * MINUTE)
    for ts in (0, 5, 40):  # two sessions: [0, 5] and [40]
        driver.produce("views", view("ann", T0 + ts * MINUTE), key="ann")
    driver.run()
    assert [(w["start"] - T0, w["value"]) for w in driver.windows("sessions", "ann")] == [
        (0, 2),
        (40 * MINUTE, 1),
    ]
    for ts in (14, 23, 32):  # each within 10 minutes of the last: one session of all six
        driver.produce("views", view("ann", T0 + ts * MINUTE), key="ann")
        driver.run()
    [session] = driver.windows("sessions", "ann")
    assert (session["start"], session["end"] - 1, session["value"]) == (T0, T0 + 40 * MINUTE, 6)


def test_a_record_later_than_its_windows_grace_is_dropped_by_its_partitions_event_time() -> None:
    topology, views = views_topology()
    hours = Tumbling(timedelta(hours=1), grace=timedelta(minutes=10))
    views.group_by(lambda v: v.page).window_by(hours).count("hourly")
    driver = TestDriver(topology, partitions=1, now_ms=T0 + 300 * MINUTE)
    hour = T0 - T0 % (60 * MINUTE)
    driver.produce("views", view("ann", hour + 65 * MINUTE), key="ann")  # event time 1h05
    driver.produce("views", view("ann", hour + 59 * MINUTE), key="ann")  # within the grace
    driver.produce("views", view("ann", hour + 75 * MINUTE), key="ann")  # event time 1h15
    driver.produce("views", view("ann", hour + 30 * MINUTE), key="ann")  # too late now
    driver.run()
    assert driver.table("hourly") == {("/", hour): 1, ("/", hour + 60 * MINUTE): 2}
    assert driver.engine.figures.steps["views.hourly.late"] == 1


@pytest.mark.parametrize("through_repartition", [False, True])
@pytest.mark.parametrize("merge", [True, False])
def test_a_late_record_misses_only_the_hopping_windows_its_grace_has_closed(
    through_repartition: bool, merge: bool
) -> None:
    topology = Topology("t")
    clicks = topology.source("clicks", Json, key="user", timestamp="ts")
    grouped = clicks.group_by(lambda c: c["user"]) if through_repartition else clicks.group_by_key()
    windowed = grouped.window_by(Hopping(10_000, 5_000, grace=2_000))
    if merge:
        windowed.sum("amounts", lambda c: c["amount"])
    else:  # values cross the repartition one by one, each with its open windows
        windowed.aggregate("amounts", lambda: 0, lambda k, c, total: total + c["amount"])
    driver = TestDriver(topology, partitions=2, now_ms=T0)
    driver.produce("clicks", {"user": "ann", "ts": T0 + 7_000, "amount": 100}, key="ann")
    # event time T0 + 7 s: [T0 - 5 s, T0 + 5 s) ended 2 s ago, as long as the grace: closed;
    # [T0, T0 + 10 s) is open
    driver.produce("clicks", {"user": "ann", "ts": T0 + 3_000, "amount": 1}, key="ann")
    driver.run()
    windows = {w["start"] - T0: w["value"] for w in driver.windows("amounts", "ann")}
    assert windows == {0: 101, 5_000: 100}
    assert driver.engine.figures.steps["t.amounts.late"] == 1  # one window missed


def test_a_session_record_is_late_only_once_its_gap_and_grace_have_passed() -> None:
    topology = Topology("t")
    events = topology.source("events", Json, key="k", timestamp="ts")
    events.group_by_key().window_by(Session(30_000, grace=1_000)).count("sessions")
    driver = TestDriver(topology, partitions=1, now_ms=T0)
    for key, ts in (("a", 0), ("a", 9_500), ("b", 10_000), ("a", 5_000)):
        driver.produce("events", {"k": key, "ts": T0 + ts}, key=key)
    driver.produce("events", {"k": "b", "ts": T0 + 100_000}, key="b")
    # event time T0 + 100 s: a session that a record opens stays open 30 s (the gap) and
    # then 1 s (the grace), so one after T0 + 69 s still counts and one at T0 + 68 s is late
    driver.produce("events", {"k": "c", "ts": T0 + 69_001}, key="c")
    driver.produce("events", {"k": "c", "ts": T0 + 68_000}, key="c")
    driver.run()
    [a] = driver.windows("sessions", "a")
    assert (a["start"] - T0, a["value"]) == (0, 3)
    assert [w["value"] for w in driver.windows("sessions", "c")] == [1]
    assert driver.engine.figures.steps["t.sessions.late"] == 1


#: An hour that starts a 5-minute and a 10-minute window.
H0 = T0 - T0 % (60 * MINUTE)


@pytest.mark.parametrize("fetch", [1, 1000])
def test_two_windows_with_a_grace_over_one_source_take_every_record_on_time(fetch: int) -> None:
    topology = Topology("t")
    clicks = topology.source("clicks", Json, key="user", timestamp="ts")
    five = Tumbling(timedelta(minutes=5), grace=timedelta(minutes=2))
    clicks.group_by_key().window_by(five).count("first")
    clicks.group_by_key().window_by(five).count("second")
    driver = TestDriver(topology, partitions=1, now_ms=H0 + 60 * MINUTE, fetch_records=fetch)
    for minute in range(20):  # in order: none is late
        driver.produce("clicks", {"user": "ann", "ts": H0 + minute * MINUTE})
    driver.run()
    expected = {("ann", H0 + start * MINUTE): 5 for start in (0, 5, 10, 15)}
    assert driver.table("first") == expected
    assert driver.table("second") == expected
    assert driver.engine.figures.steps["t.first.late"] == 0
    assert driver.engine.figures.steps["t.second.late"] == 0


#: One user's clicks, in minutes after H0, in offset order: in order up to minute 11,
#: then 9 and 4 (2 and 7 minutes behind), in order again, and 14 at minute 30.
CLICK_MINUTES = (*range(12), 9, 4, *range(12, 20), 30, 14)


def at(minute: int) -> tuple[str, int]:
    return ("ann", H0 + minute * MINUTE)


@pytest.mark.parametrize("fetch", [1, 5, 1000])
@pytest.mark.parametrize("order", [tuple(WINDOWS), tuple(reversed(WINDOWS))])
def test_windows_with_a_grace_over_one_source_each_judge_a_record_by_the_records_before_it(
    order: tuple[str, ...], fetch: int
) -> None:
    driver = TestDriver(
        clicks_topology(order), partitions=1, now_ms=H0 + 60 * MINUTE, fetch_records=fetch
    )
    for minute in CLICK_MINUTES:
        driver.produce(CLICKS, {"user": "ann", "ts": H0 + minute * MINUTE})
    driver.run()
    # At minute 11, 9 is in time for all its windows. 4 misses [0, 5) and [-5, 5), which
    # ended 2 minutes (the grace) or more before, and its session (more than gap 5 +
    # grace 1 behind); it counts in [0, 10). At minute 30, 14 misses all its windows.
    assert driver.table("clicks_per_5m") == {at(0): 5, at(5): 6, at(10): 5, at(15): 5, at(30): 1}
    assert driver.table("clicks_per_10m") == {
        at(-5): 5,
        at(0): 12,
        at(5): 11,
        at(10): 10,
        at(15): 5,
        at(25): 1,
        at(30): 1,
    }
    sessions = [(w["start"], w["end"], w["value"]) for w in driver.windows("click_sessions", "ann")]
    assert sessions == [(H0, H0 + 19 * MINUTE + 1, 21), (H0 + 30 * MINUTE, H0 + 30 * MINUTE + 1, 1)]
    late = {table: driver.engine.figures.steps[f"clicks.{table}.late"] for table in WINDOWS}
    assert late == {"clicks_per_5m": 2, "click_sessions": 2, "clicks_per_10m": 3}


@pytest.mark.parametrize("fetch", [1, 1000])
def test_a_record_a_step_dead_letters_does_not_move_the_event_time_of_the_window_after_it(
    fetch: int,
) -> None:
    def checked(click: dict[str, Any]) -> dict[str, Any]:
        if click.get("bad"):
            raise ValueError("a bad click")
        return click

    topology = Topology("t")
    clicks = topology.source("clicks", Json, key="user", timestamp="ts")
    five = Tumbling(timedelta(minutes=5), grace=timedelta(minutes=2))
    clicks.group_by_key().window_by(five).count("all")
    clicks.map(checked).group_by_key().window_by(five).count("checked")
    driver = TestDriver(topology, partitions=1, now_ms=H0 + 60 * MINUTE, fetch_records=fetch)
    driver.produce("clicks", {"user": "ann", "ts": H0})
    driver.produce("clicks", {"user": "ann", "ts": H0 + 30 * MINUTE, "bad": True})
    driver.produce("clicks", {"user": "ann", "ts": H0 + 14 * MINUTE})
    driver.run()
    assert [d.reason for d in driver.dead_letters("clicks")] == [
        "processing failed: ValueError: a bad click"
    ]
    assert driver.table("all") == {at(0): 1, at(30): 1}  # 14 is 16 minutes behind 30
    assert driver.table("checked") == {at(0): 1, at(10): 1}  # 30 never reached it


def test_windows_take_up_the_event_time_their_topology_kept_for_all_its_pipelines() -> None:
    """A deployment before each pipeline kept its own source event time kept one per
    topology and topic: every windowed aggregation takes it up from there."""
    driver = TestDriver(clicks_topology(), partitions=1, now_ms=H0 + 60 * MINUTE)
    state = driver.tables[state_table(clicks_topology())]
    driver.produce(
        state.changelog_topic, H0 + 30 * MINUTE, key=f"stream-time:{CLICKS}", partition=0
    )
    driver.restart()
    driver.produce(CLICKS, {"user": "ann", "ts": H0 + 14 * MINUTE})  # 16 minutes behind
    driver.produce(CLICKS, {"user": "ann", "ts": H0 + 29 * MINUTE})
    driver.run()
    assert driver.table("clicks_per_5m") == {at(25): 1}
    assert driver.table("clicks_per_10m") == {at(20): 1, at(25): 1}
    assert [w["value"] for w in driver.windows("click_sessions", "ann")] == [1]
    late = {table: driver.engine.figures.steps[f"clicks.{table}.late"] for table in WINDOWS}
    assert late == {"clicks_per_5m": 1, "click_sessions": 1, "clicks_per_10m": 2}


def test_late_and_expired_records_reach_the_workers_metrics() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from api.metrics import window_drops

    topology, views = views_topology()
    minutes = Tumbling(timedelta(minutes=1), grace=timedelta(0), retention=timedelta(hours=1))
    views.group_by_key().window_by(minutes).count("per_minute")
    driver = TestDriver(topology, partitions=1, now_ms=T0 + 30 * MINUTE)
    driver.produce("views", view("bob", T0 - 2 * 60 * MINUTE), key="bob")  # expired
    driver.produce("views", view("ann", T0 + 5 * MINUTE), key="ann")
    driver.produce("views", view("ann", T0 + 2 * MINUTE), key="ann")  # late
    driver.run()
    ann = T0 + 5 * MINUTE
    assert driver.table("per_minute") == {("ann", ann - ann % MINUTE): 1}

    class Steps:  # the family the worker's collector gives, on the driver's engine
        def collect(self) -> Any:
            yield window_drops(driver.engine.figures.steps)

    registry = CollectorRegistry()
    registry.register(Steps())  # type: ignore[arg-type]
    text = generate_latest(registry).decode()
    assert (
        'streamstate_window_records_dropped_total{reason="late",step="views.per_minute"} 1.0'
        in text
    )
    assert (
        'streamstate_window_records_dropped_total{reason="expired",step="views.per_minute"} 1.0'
        in text
    )


# -- joins -----------------------------------------------------------------------------------


def test_a_global_table_join_reads_the_value_as_of_the_events_time() -> None:
    topology, views = views_topology()
    accounts = topology.global_table("accounts", Model(Account), key="user")
    views.join(accounts, lambda v, a: a.plan if a else "none", how="left", key=lambda v: v.user).to(
        "plans"
    )
    driver = TestDriver(topology, partitions=2)
    driver.produce("accounts", {"user": "ann", "plan": "free"}, key="ann", timestamp=T0)
    driver.produce("accounts", {"user": "ann", "plan": "pro"}, key="ann", timestamp=T0 + MINUTE)
    driver.produce("accounts", None, key="ann", timestamp=T0 + 2 * MINUTE)  # deleted
    driver.produce("accounts", b"broken", key="bob", timestamp=T0)  # invalid: left out
    for ts in (T0 - 1, T0, T0 + MINUTE + 1, T0 + 3 * MINUTE):
        driver.produce("views", view("ann", ts), key="ann")
    driver.run()
    assert [r.value for r in driver.outputs("plans")] == [b"none", b"free", b"pro", b"none"]
    [dead] = driver.dead_letters("accounts")
    assert dead.value == b"broken"


def test_an_inner_global_join_drops_the_records_that_find_nothing() -> None:
    topology, views = views_topology()
    accounts = topology.global_table("accounts", Model(Account), key="user")
    views.join(accounts, lambda v, a: a.plan, key=lambda v: v.user).to("plans")
    driver = TestDriver(topology, partitions=1)
    driver.produce("accounts", {"user": "ann", "plan": "pro"}, key="ann", timestamp=0)
    driver.produce("views", view("ann", T0), key="ann")
    driver.produce("views", view("bob", T0), key="bob")
    driver.run()
    assert [r.value for r in driver.outputs("plans")] == [b"pro"]


def test_a_table_join_reads_the_table_as_the_cycle_found_it() -> None:
    topology, views = views_topology()
    counts = views.group_by_key().count("views_so_far")
    views.join(counts, lambda v, n: f"{v.page}:{n}", how="left").to("numbered")
    driver = TestDriver(topology, partitions=2)
    driver.produce("views", view("ann", T0, "/a"), key="ann")
    driver.produce("views", view("ann", T0 + 1, "/b"), key="ann")
    driver.run()  # one cycle: both find the table before it
    driver.produce("views", view("ann", T0 + 2, "/c"), key="ann")
    driver.run()
    assert [r.value for r in driver.outputs("numbered")] == [b"/a:None", b"/b:None", b"/c:2"]


def test_a_windowed_stream_join_pairs_records_within_the_window_and_left_joins_the_rest() -> None:
    topology = Topology("orders")
    orders = topology.source("orders", Json, key="id", timestamp="ts")
    ships = topology.source("shipments", Json, key="order", timestamp="ts")
    window = JoinWindow(before_ms=0, after_ms=10 * MINUTE)
    joined = orders.join(
        ships, lambda o, s: [o["id"], s and s["carrier"]], how="left", window=window
    )
    joined.to("fulfilment")
    driver = TestDriver(topology, partitions=1)
    driver.produce("orders", {"id": "o1", "ts": T0}, key="o1")
    driver.produce("orders", {"id": "o2", "ts": T0}, key="o2")
    driver.produce("shipments", {"order": "o1", "carrier": "ups", "ts": T0 + MINUTE}, key="o1")
    driver.produce("shipments", {"order": "o2", "carrier": "dhl", "ts": T0 + 11 * MINUTE}, key="o2")
    driver.run()
    assert [r.json() for r in driver.outputs("fulfilment")] == [["o1", "ups"]]
    # event time passes o2's window on both topics of its partition: o2 is unmatched
    later = {"id": "o9", "order": "o9", "carrier": "x", "ts": T0 + 30 * MINUTE}
    for topic in ("orders", "shipments"):
        driver.produce(topic, later, key="o9")
    driver.run()
    results = Counter(tuple(r.json()) for r in driver.outputs("fulfilment"))
    assert results[("o2", None)] == 1
    assert results[("o1", "ups")] == 1
    # the join's own tables read as any other: the buffer by join key; the index holds
    # the watermarks and chunks under binary keys, which stay bytes
    [buffer] = [name for name in driver.specs if name.endswith("-join-buffer")]
    [index] = [name for name in driver.specs if name.endswith("-join-index")]
    assert set(driver.table(buffer)) == {"o9"}
    keys = set(driver.table(index))
    assert {"wl", "wr"} <= keys
    assert any(isinstance(key, bytes) for key in keys)


# -- mistakes, named by step ------------------------------------------------------------------


def test_mistakes_in_a_declaration_name_the_topology_and_the_step() -> None:
    topology, views = views_topology()
    with pytest.raises(TopologyError, match=r"topology 'views', step 'map.*must be callable"):
        views.map("upper")  # type: ignore[arg-type]
    with pytest.raises(TopologyError, match=r"needs key="):
        views.join(topology.global_table("accounts"), lambda v, a: v)
    with pytest.raises(TopologyError, match=r"needs window="):
        views.join(views, lambda a, b: a)
    with pytest.raises(TopologyError, match="declared twice, differently"):
        topology.source("views", Json)
    with pytest.raises(TopologyError, match="session windows merge aggregates"):
        views.group_by_key().window_by(Session(gap=MINUTE)).aggregate("s", list, lambda k, v, a: a)
    views.group_by_key().count("per_user")
    with pytest.raises(TopologyError, match="'per_user' is written by two aggregations"):
        views.group_by_key().count("per_user")
    with pytest.raises(TopologyError, match="not a value type"):
        topology.source("other", str)  # type: ignore[arg-type]


def test_a_source_field_its_values_cannot_have_fails_at_declaration() -> None:
    topology = Topology("t")
    with pytest.raises(TopologyError) as wrong:
        topology.source("views", Model(View), key="usr", timestamp="ts")
    assert str(wrong.value) == (
        "topology 't', source 'views': key='usr' is not a field of View "
        "(its fields: user, page, ts)"
    )
    with pytest.raises(TopologyError) as text:
        topology.source("lines", Text, timestamp="ts")
    assert "timestamp='ts' names a field, and text values have none" in str(text.value)
    with pytest.raises(TopologyError):
        topology.global_table("accounts", Model(Account), key="id")
    views = topology.source("views", Model(View), key="user", timestamp="ts")
    with pytest.raises(TopologyError) as keyless:
        views.group_by()
    assert str(keyless.value) == (
        "topology 't', step 'source(views)': group_by() without a key groups by the value "
        "itself, which must be text, and its values are View: give group_by a key function"
    )


def test_names_windows_and_joins_that_cannot_work_fail_at_declaration() -> None:
    topology = Topology("t")
    events = topology.source("events", Json)
    mistakes = {
        "topology 't', step 'source(events)': window_by(60000): a window is Tumbling(size), "
        "Hopping(size, advance) or Session(gap)": lambda: events.group_by_key().window_by(
            60_000  # type: ignore[arg-type]
        ),
        "topology 't': table '': letters, digits, '.', '_' and '-' only": lambda: (
            events.group_by_key().count("")
        ),
        "topology 't': output topic 'my topic/1': letters, digits, '.', '_' and '-' only": (
            lambda: events.to("my topic/1")
        ),
        "topology 't', step 'source(events)': table 't-state': names ending in -state, "
        "-join-buffer, -join-index are kept for the tables a topology keeps itself": lambda: (
            events.group_by_key().count("t-state")
        ),
    }
    other = Topology("other")
    users = other.global_table("users", Json, key="id")
    mistakes[
        "topology 't', step 'source(events)': join(users): 'users' belongs to topology "
        "'other'; declare what a topology joins in that topology"
    ] = lambda: events.join(users, lambda e, u: u, key=lambda e: "x")
    for message, mistake in mistakes.items():
        with pytest.raises(TopologyError) as refused:
            mistake()
        assert str(refused.value) == message
    first, second = Topology("a"), Topology("b")
    first.source("x", Json).group_by_key().count("c")
    second.source("y", Json).group_by_key().count("c")
    with pytest.raises(TopologyError, match="table 'c' is written by topologies 'a' and 'b'"):
        TestDriver(first, second)
    again = Topology("a")
    again.source("z", Json).group_by_key().count("d")
    with pytest.raises(TopologyError, match="two topologies are named 'a'"):
        TestDriver(first, again)


def test_a_stream_join_after_a_flat_map_fails_at_compile_naming_the_join() -> None:
    topology, views = views_topology()
    pages = views.flat_map(lambda v: [v, v], value_type=Model(View))
    pages.join(views, lambda a, b: a, window=JoinWindow(0, MINUTE)).to("pairs")
    with pytest.raises(TopologyError, match=r"step 'join\(stream\)'.*not through 'flat_map"):
        TestDriver(topology)


def test_two_modules_cannot_give_one_topic_two_types() -> None:
    first, second = Topology("a"), Topology("b")
    first.source("shared", Json).to("out-a")
    second.source("shared", Text).to("out-b")
    with pytest.raises(TopologyError, match="'shared' is declared with two types"):
        TestDriver(first, second)


def test_a_windowed_grace_after_a_stream_join_is_refused() -> None:
    topology = Topology("t")
    left = topology.source("l", Json, timestamp="ts")
    right = topology.source("r", Json, timestamp="ts")
    joined = left.join(right, lambda a, b: a, window=JoinWindow(0, MINUTE))
    joined.group_by_key().window_by(Tumbling(MINUTE, grace=0)).count("late")
    with pytest.raises(TopologyError, match="grace must not follow a stream join"):
        TestDriver(topology)


def test_ten_thousand_records_through_a_repartition_and_a_window_count_exactly() -> None:
    """The driver's size figure (its time shows in ``make test``'s durations): 10,000
    views over 4 partitions, re-keyed by page through a repartition topic, counted in
    5-minute windows; every window's count equals a plain count of the records."""
    topology, views = views_topology()
    pages = views.group_by(lambda v: v.page)
    pages.window_by(Tumbling(5 * MINUTE, retention=24 * 60 * MINUTE)).count("page_views")
    driver = TestDriver(topology, partitions=4, now_ms=T0 + 90 * MINUTE)
    expected: Counter[tuple[str, int]] = Counter()
    for n in range(10_000):
        ts = T0 + (n * 7919) % (60 * MINUTE)
        page = f"/p{n % 37}"
        driver.produce("views", view(f"u{n % 101}", ts, page), key=f"u{n % 101}")
        expected[(page, ts - ts % (5 * MINUTE))] += 1
    driver.run()
    assert driver.table("page_views") == dict(expected)


def test_a_global_table_record_without_its_key_field_is_refused_with_that_reason() -> None:
    from core.values import InvalidEvent
    from tables.global_table import GlobalSpec, checked

    spec = GlobalSpec("accounts", "accounts", Json, "user", 4)
    with pytest.raises(InvalidEvent) as refused:
        checked(spec, b"ann", b'{"plan": "pro"}', 1 << 20)
    assert refused.value.reason == "user: Field required"
    assert checked(spec, b"ann", b'{"user": "ann"}', 1 << 20) == '{"user": "ann"}'
