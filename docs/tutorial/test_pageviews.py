"""Tests of the tutorial's pipeline, in process: no broker."""

import pageviews
import pytest

from streams.testing import Crash, TestDriver

T0 = 1_764_000_000_000  # a time at the start of a 5-minute window
MINUTE = 60_000


def test_views_are_counted_per_user_and_per_country_in_five_minute_windows() -> None:
    driver = TestDriver(pageviews, partitions=4)
    driver.produce("users", {"user": "ann", "country": "fr"}, key="ann", timestamp=0)
    for minute in (0, 1, 7):
        driver.produce("page-views", {"user": "ann", "page": "/", "ts": T0 + minute * MINUTE})
    driver.produce("page-views", {"user": "bob", "page": "/", "ts": T0 + 2 * MINUTE})
    driver.run()

    assert driver.windows("views_per_user", "ann") == [
        {"start": T0, "end": T0 + 5 * MINUTE, "value": 2},
        {"start": T0 + 5 * MINUTE, "end": T0 + 10 * MINUTE, "value": 1},
    ]
    assert driver.table("views_per_country") == {
        ("fr", T0): 2,
        ("fr", T0 + 5 * MINUTE): 1,
        ("unknown", T0): 1,  # bob is in no users record
    }


def test_a_view_that_is_not_valid_goes_to_the_dead_letter_topic() -> None:
    driver = TestDriver(pageviews)
    driver.produce("page-views", {"user": "ann", "page": "/"})  # no ts
    driver.run()
    [dead] = driver.dead_letters("page-views")
    assert dead.reason == "ts: Field required"
    assert driver.table("views_per_user") == {}


def test_a_crash_in_the_middle_of_a_cycle_loses_and_repeats_nothing() -> None:
    driver = TestDriver(pageviews, exactly_once=True)
    for n in range(1000):
        driver.produce("page-views", {"user": f"u{n % 10}", "page": "/", "ts": T0 + n})
    driver.crash("before_the_store")  # Kafka took the cycle; the process died before its store
    with pytest.raises(Crash):
        driver.run()
    driver.restart()  # a new process on the same disk restores from the changelogs
    driver.run()
    assert sum(w["value"] for w in driver.windows("views_per_user", "u3")) == 100
