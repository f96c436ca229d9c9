"""After a rebalance of a running member, fetches hand out a few times the usual records
per partition until the backlog is worked off (tables/catchup.py)."""

from __future__ import annotations

import logging

import pytest

from tables import catchup
from tables.catchup import CatchUp


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def running(clock: Clock, per_partition: int = 300) -> CatchUp:
    catch_up = CatchUp(clock)
    catch_up.observe(per_partition * 4, 4)
    return catch_up


def test_a_members_first_assignment_caps_nothing() -> None:
    catch_up = CatchUp(Clock())
    catch_up.begin()
    assert catch_up.cap() is None
    assert catch_up.begun == 0


def test_after_a_rebalance_a_fetch_takes_twice_the_usual_records_per_partition() -> None:
    clock = Clock()
    catch_up = running(clock)
    assert catch_up.cap() is None  # no rebalance yet
    catch_up.begin()
    assert catch_up.cap() == 2 * 300


def test_the_cap_never_goes_below_the_floor() -> None:
    clock = Clock()
    catch_up = running(clock, per_partition=3)
    catch_up.begin()
    assert catch_up.cap() == catchup.FLOOR


def test_the_usual_size_follows_the_cycles_smoothed_and_ignores_empty_ones() -> None:
    catch_up = CatchUp(Clock())
    catch_up.observe(100, 1)
    catch_up.observe(0, 0)  # a cycle that only moved past transaction markers
    catch_up.observe(600, 2)
    assert catch_up.usual == pytest.approx(100 + catchup.SMOOTHING * (300 - 100))


def test_capped_cycles_do_not_change_the_usual_size() -> None:
    clock = Clock()
    catch_up = running(clock)
    catch_up.begin()
    catch_up.observe(600 * 20, 20)
    assert catch_up.usual == 300


@pytest.mark.parametrize("left_behind", [True, False])
def test_a_catch_up_ends_with_the_first_fetch_that_leaves_nothing_behind(
    left_behind: bool, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    catch_up = running(clock)
    catch_up.begin()
    caplog.set_level(logging.INFO, logger=catchup.__name__)
    catch_up.fetched(left_behind=True)
    clock.now += 0.25
    catch_up.fetched(left_behind=left_behind)
    assert (catch_up.cap() is not None) is left_behind
    ended = [r.getMessage() for r in caplog.records if "ended" in r.getMessage()]
    if left_behind:
        assert ended == []
    else:
        assert ended == [
            "capped fetches after the assignment ended: the backlog was worked off, "
            "after 2 fetches in 0.25 s"
        ]


def test_a_catch_up_ends_when_its_time_is_up_even_with_records_left_behind() -> None:
    clock = Clock()
    catch_up = running(clock)
    catch_up.begin()
    clock.now += catchup.MAX_S - 0.01
    catch_up.fetched(left_behind=True)
    assert catch_up.cap() is not None
    clock.now += 0.02
    assert catch_up.cap() is None
    catch_up.observe(50 * 4, 4)  # counted again once it ended
    assert catch_up.usual == pytest.approx(300 + catchup.SMOOTHING * (50 - 300))


def test_each_rebalance_begins_a_new_catch_up() -> None:
    clock = Clock()
    catch_up = running(clock)
    catch_up.begin()
    catch_up.fetched(left_behind=False)
    assert catch_up.cap() is None
    catch_up.begin()
    assert catch_up.cap() == 600
    assert catch_up.begun == 2


def test_each_capped_fetch_may_take_twice_as_many_as_the_one_before() -> None:
    clock = Clock()
    catch_up = running(clock)
    catch_up.begin()
    caps = []
    for _ in range(4):
        caps.append(catch_up.cap())
        catch_up.fetched(left_behind=True)
    assert caps == [600, 1200, 2400, 4800]


def test_a_catch_up_logs_its_first_cap_and_its_growth(caplog: pytest.LogCaptureFixture) -> None:
    catch_up = running(Clock())
    caplog.set_level(logging.INFO, logger=catchup.__name__)
    catch_up.begin()
    assert [r.getMessage() for r in caplog.records] == [
        "after the assignment, the first fetch hands out at most 600 records per source "
        "partition (300 per cycle before it) and each further one 2 times as many, until "
        "the backlog is worked off, for at most 3 s"
    ]
