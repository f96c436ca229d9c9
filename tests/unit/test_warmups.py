"""Warm handover: the plan over one group of partitions, and the assignor over faust's,
member by member as a group's join hands them their metadata."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from faust.types import TP

from tables.warmups import (
    COPIES_FILE,
    WarmupAssignor,
    WarmupWatch,
    copy_offsets,
    furthest_copies,
    plan_handover,
    read_copies,
    standby_lags,
    write_copies,
)

ACCEPTABLE = 100


def lags_of(table: Mapping[tuple[str, int], int]) -> Any:
    return lambda member, partition: table.get((member, partition))


def test_a_move_to_a_cold_copy_is_taken_back_and_warmed_up() -> None:
    plan = plan_handover(
        proposed={0: "a", 1: "a", 2: "b", 3: "b"},
        previous={0: "a", 1: "a", 2: "a", 3: "a"},
        lag=lags_of({("b", 2): 5_000}),
        acceptable=ACCEPTABLE,
    )
    assert plan.actives == {0: "a", 1: "a", 2: "a", 3: "a"}
    assert plan.warmups == {"b": {2, 3}}


def test_a_move_to_a_warm_copy_goes_ahead() -> None:
    plan = plan_handover(
        proposed={0: "a", 1: "a", 2: "b", 3: "b"},
        previous={0: "a", 1: "a", 2: "a", 3: "a"},
        lag=lags_of({("b", 2): ACCEPTABLE, ("b", 3): 0}),
        acceptable=ACCEPTABLE,
    )
    assert plan.actives == {0: "a", 1: "a", 2: "b", 3: "b"}
    assert plan.warmups == {}


def test_a_partition_whose_owner_left_goes_where_proposed() -> None:
    plan = plan_handover(
        proposed={0: "a", 1: "b"},
        previous={0: "a"},  # partition 1's owner is no longer a member
        lag=lags_of({}),
        acceptable=ACCEPTABLE,
    )
    assert plan.actives == {0: "a", 1: "b"}
    assert plan.warmups == {}


def test_a_member_short_of_its_share_takes_a_partition_it_is_warm_for() -> None:
    # faust proposes partition 1 for b, whose copy of it is cold, but b has kept a warm
    # copy of partition 0: b takes 0 instead, and nothing waits.
    plan = plan_handover(
        proposed={0: "a", 1: "b", 2: "a", 3: "b"},
        previous={0: "a", 1: "a", 2: "a", 3: "b"},
        lag=lags_of({("b", 0): 3, ("b", 1): 50_000}),
        acceptable=ACCEPTABLE,
    )
    assert plan.actives == {0: "b", 1: "a", 2: "a", 3: "b"}
    assert plan.warmups == {}


def test_the_warmest_copy_is_taken_first() -> None:
    plan = plan_handover(
        proposed={0: "a", 1: "a", 2: "a", 3: "b"},
        previous={0: "a", 1: "a", 2: "a", 3: "a"},
        lag=lags_of({("b", 0): 90, ("b", 1): 2}),
        acceptable=ACCEPTABLE,
    )
    assert plan.actives == {0: "a", 1: "b", 2: "a", 3: "a"}
    assert plan.warmups == {}


# -- the assignor, member by member ------------------------------------------------------

SOURCE = "lines"
CHANGELOG = "app-counts-changelog"
PARTITIONS = 4


class Cluster:
    def partitions_for_topic(self, topic: str) -> set[int]:
        return set(range(PARTITIONS))


class Sensors:
    def on_assignment_start(self, assignor: Any) -> dict[str, Any]:
        return {}

    def on_assignment_completed(self, assignor: Any, state: Any) -> None:
        pass

    def on_assignment_error(self, assignor: Any, state: Any, exc: BaseException) -> None:
        pass


def member(url: str, acceptable: int = ACCEPTABLE) -> WarmupAssignor:
    tables = SimpleNamespace(changelog_topics={CHANGELOG}, data={})
    app = SimpleNamespace(
        tables=tables,
        conf=SimpleNamespace(canonical_url=url),
        sensors=Sensors(),
        tracer=None,
        settings=SimpleNamespace(acceptable_recovery_lag=acceptable, warm_handover=True),
    )
    return WarmupAssignor(app, replicas=1)


def join(members: Mapping[str, WarmupAssignor]) -> dict[str, Any]:
    """One rebalance: every member's metadata to the first (the leader), and each
    member's assignment back to it."""
    metadata = {name: m.metadata({SOURCE, CHANGELOG}) for name, m in members.items()}
    leader = next(iter(members.values()))
    given = leader.assign(Cluster(), metadata)
    for name, m in members.items():
        m.on_assignment(given[name])
    return given


def actives(m: WarmupAssignor, topic: str) -> set[int]:
    return {tp.partition for tp in m.assigned_actives() if tp.topic == topic}


def standbys(m: WarmupAssignor) -> set[int]:
    return {tp.partition for tp in m.assigned_standbys() if tp.topic == CHANGELOG}


def holding(m: WarmupAssignor, offset: int, partitions: Any = range(PARTITIONS)) -> None:
    """The member's copies of ``partitions`` hold ``offset``, as its watch measured."""
    m.offsets = {CHANGELOG: dict.fromkeys(partitions, offset)}


def test_a_new_member_warms_up_before_partitions_move_to_it() -> None:
    first = member("http://a:1")
    join({"a": first})
    assert actives(first, SOURCE) == set(range(PARTITIONS))
    holding(first, 5_000)

    second = member("http://b:1")
    join({"a": first, "b": second})
    # Nothing moved: b's copies are cold. It warms up two partitions as standbys.
    assert actives(first, SOURCE) == actives(first, CHANGELOG) == set(range(PARTITIONS))
    assert actives(second, SOURCE) == actives(second, CHANGELOG) == set()
    warming = set(second.warmups[CHANGELOG])
    assert len(warming) == 2
    assert warming <= standbys(second)
    assert first.warmups == {}

    # b reports its copies caught up: the next rebalance moves them.
    holding(second, 5_000 - 7, warming)
    given = join({"a": first, "b": second})
    assert actives(second, SOURCE) == actives(second, CHANGELOG) == warming
    assert actives(first, SOURCE) == set(range(PARTITIONS)) - warming
    assert second.warmups == {}
    # a keeps a standby of what it handed over
    assert warming <= standbys(first)
    b_topics = dict(given["b"].assignment)
    assert sorted(b_topics[SOURCE]) == sorted(warming)


def test_copies_still_behind_stay_where_they_are() -> None:
    first, second = member("http://a:1"), member("http://b:1")
    join({"a": first})
    holding(first, 5_000)
    join({"a": first, "b": second})
    warming = set(second.warmups[CHANGELOG])
    holding(second, 5_000 - ACCEPTABLE - 1, warming)
    join({"a": first, "b": second})
    assert actives(second, SOURCE) == set()
    assert set(second.warmups[CHANGELOG]) == warming


def test_a_leaving_member_hands_its_partitions_to_the_others_at_once() -> None:
    first, second = member("http://a:1"), member("http://b:1")
    join({"a": first, "b": second})
    assert actives(first, SOURCE)
    assert actives(second, SOURCE)
    join({"a": first})
    assert actives(first, SOURCE) == set(range(PARTITIONS))
    assert first.warmups == {}


def test_the_furthest_copy_of_a_partition_whose_owner_left_is_found() -> None:
    reported = {
        "a": {"x": {0: 90, 1: 50}, "y": {0: 9, 1: 5}},
        "b": {"x": {0: 100, 1: 50}, "y": {0: 10}},
        "c": {"x": {1: 50}, "y": {1: 5}},
    }
    found = furthest_copies([0, 1, 2], {0: "c", 1: "c", 2: "c"}, reported, ["x", "y"])
    # 0: b is 0 behind, a 10, c holds none; 1: a tie of a and c, c is faust's choice
    # (b lacks y's copy); 2: nobody holds a copy.
    assert found == {0: "b", 1: "c"}


def test_a_leaving_member_hands_its_partitions_to_the_warm_copies() -> None:
    a, b, c = member("http://a:1"), member("http://b:1"), member("http://c:1")
    join({"a": a, "b": b, "c": c})
    left = actives(c, SOURCE)
    assert left
    # a holds warm copies of every partition; b only of those it or a owned.
    holding(a, 5_000)
    holding(b, 5_000, set(range(PARTITIONS)) - left)
    join({"a": a, "b": b})
    assert actives(a, SOURCE) | actives(b, SOURCE) == set(range(PARTITIONS))
    assert actives(a, SOURCE) >= left  # none of c's went to b's cold copies
    assert len(actives(b, SOURCE)) == PARTITIONS // 2  # b took warm ones of a's instead
    assert a.warmups == b.warmups == {}


def test_without_warm_handover_faust_moves_partitions_at_once() -> None:
    first, second = member("http://a:1"), member("http://b:1")
    for m in (first, second):
        m.app.settings.warm_handover = False
    join({"a": first})
    join({"a": first, "b": second})
    assert len(actives(second, SOURCE)) == 2
    assert second.warmups == {}


@pytest.mark.parametrize(
    ("applied", "end", "lag"),
    [(None, 10, 10), (4, 10, 5), (9, 10, 0), (12, 10, 0)],
)
def test_a_standby_lag_is_the_end_less_what_it_applied(
    applied: int | None, end: int, lag: int
) -> None:
    tp = TP(CHANGELOG, 3)
    app = SimpleNamespace(
        tables=SimpleNamespace(
            recovery=SimpleNamespace(standby_tps={tp}, standby_offsets={tp: applied})
        ),
        consumer=SimpleNamespace(highwater=lambda _: end),
    )
    assert standby_lags(app) == {CHANGELOG: {3: lag}}


class Rejoins:
    def __init__(self) -> None:
        self.asked = 0

    async def __call__(self) -> None:
        self.asked += 1


class NoTables(SimpleNamespace):
    """A table manager holding no table open (only its recovery is looked at)."""

    def values(self) -> list[Any]:
        return []


def watched(lag: int, assigned_ago: float) -> tuple[WarmupWatch, Rejoins]:
    """A worker warming up partitions 1 and 2 of the changelog, each ``lag`` behind."""
    assignor = member("http://b:1")
    assignor.warmups = {CHANGELOG: [1, 2]}
    assignor.assignments = 2
    assignor.assigned_at = time.monotonic() - assigned_ago
    tps = {TP(CHANGELOG, 1), TP(CHANGELOG, 2)}
    app = SimpleNamespace(
        assignor=assignor,
        rebalancing=False,
        tables=NoTables(
            recovery=SimpleNamespace(standby_tps=tps, standby_offsets={tp: 99 for tp in tps})
        ),
        consumer=SimpleNamespace(highwater=lambda _: 100 + lag),
    )
    rejoins = Rejoins()
    return WarmupWatch(app, rejoin=rejoins), rejoins


def test_the_watch_asks_once_its_warmups_are_within_the_lag() -> None:
    watch, rejoins = watched(lag=ACCEPTABLE, assigned_ago=WarmupWatch.settle_s + 1)
    assert asyncio.run(watch.check())
    assert rejoins.asked == 1
    assert watch.app.assignor.lags == {CHANGELOG: {1: ACCEPTABLE, 2: ACCEPTABLE}}
    # once per assignment
    assert not asyncio.run(watch.check())
    assert rejoins.asked == 1


def test_with_no_warmup_the_watch_measures_only_when_it_writes_the_copies() -> None:
    watch, rejoins = watched(lag=5, assigned_ago=WarmupWatch.settle_s + 1)
    watch.app.assignor.warmups = {}
    measured = []
    for _ in range(2 * WarmupWatch.write_every):
        watch.app.assignor.lags = {}
        assert not asyncio.run(watch.check())
        measured.append(watch.app.assignor.lags != {})
    assert measured == ([False] * (WarmupWatch.write_every - 1) + [True]) * 2
    assert rejoins.asked == 0
    watch.app.assignor.warmups = {CHANGELOG: [1, 2]}  # warm-ups: measured at every check
    watch.app.assignor.lags = {}
    asyncio.run(watch.check())
    assert watch.app.assignor.lags == {CHANGELOG: {1: 5, 2: 5}}


def test_the_watch_waits_while_warmups_are_behind_or_the_assignment_is_new() -> None:
    behind, asked_behind = watched(lag=ACCEPTABLE + 1, assigned_ago=WarmupWatch.settle_s + 1)
    assert not asyncio.run(behind.check())
    fresh, asked_fresh = watched(lag=0, assigned_ago=0.0)
    assert not asyncio.run(fresh.check())
    assert asked_behind.asked == asked_fresh.asked == 0


def test_a_member_back_with_recent_copies_on_disk_takes_its_partitions_at_once(
    tmp_path: Path,
) -> None:
    first, second = member("http://a:1"), member("http://b:1")
    join({"a": first, "b": second})
    held = actives(second, CHANGELOG)
    holding(first, 9_000)
    holding(second, 8_990, held)
    write_copies(tmp_path / COPIES_FILE, second.offsets)
    join({"a": first})  # b is gone: its partitions move to a
    assert actives(first, SOURCE) == set(range(PARTITIONS))
    # b's process starts again on its data dir: what it left on disk is its report.
    again = member("http://b:1")
    again.offsets = read_copies(tmp_path / COPIES_FILE)
    assert again.offsets == {CHANGELOG: dict.fromkeys(held, 8_990)}
    join({"a": first, "b": again})
    assert actives(again, SOURCE) == held
    assert again.warmups == {}


def test_copies_on_disk_that_cannot_be_read_are_none(tmp_path: Path) -> None:
    assert read_copies(tmp_path / "absent.json") == {}
    (tmp_path / COPIES_FILE).write_text("not json")
    assert read_copies(tmp_path / COPIES_FILE) == {}


def test_the_offsets_of_the_copies_held_open_are_those_their_databases_hold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.main import create_app
    from core.settings import Settings
    from tables.faust_adapter import FaustTableStore, write_changes

    monkeypatch.setenv("APP_DATADIR", str(tmp_path))
    app = create_app(Settings())
    table = app.tables["word_counts"]
    write_changes(table.data, 3, [(b"fox", b"1")], 41)
    FaustTableStore(table).partition(5)  # open, nothing written yet
    topic = table.changelog_topic.get_topic_name()
    assert copy_offsets(app) == {topic: {3: 41}}


def test_the_same_warmups_back_after_asking_wait_the_longer_probe() -> None:
    watch, rejoins = watched(lag=0, assigned_ago=WarmupWatch.settle_s + 1)
    assert asyncio.run(watch.check())
    assignor = watch.app.assignor
    assignor.assignments += 1  # the leader gave the same warm-ups back
    assignor.assigned_at = time.monotonic() - WarmupWatch.settle_s - 1
    assert not asyncio.run(watch.check())
    assignor.assigned_at = time.monotonic() - watch.probe_after_s - 1
    assert asyncio.run(watch.check())
    assert rejoins.asked == 2
