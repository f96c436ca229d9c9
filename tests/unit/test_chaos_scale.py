"""The scaling scenario's measures and checks fail when what they name goes wrong."""

from __future__ import annotations

from typing import Any

import pytest

from chaos import checks
from chaos.compare import TableDrift
from chaos.scenarios.scale import Offsets, longest_stalls, moved, owners, p99_ms, split_stalls

LEVEL = {"lines_per_s": 1000.0, "events_per_s": 100.0, "source": "test"}
A, B = ("text-lines", 0), ("text-lines", 1)


def offsets(*rows: tuple[float, int, int]) -> list[Offsets]:
    """Samples of partition A: (when, committed, end); B stays caught up at 5."""
    return [(at, {A: done, B: 5}, {A: end, B: 5}) for at, done, end in rows]


def test_a_partition_stalls_while_its_offset_stands_still_with_records_waiting() -> None:
    samples = offsets((0.0, 10, 12), (0.2, 10, 14), (0.4, 10, 20), (1.4, 18, 20), (1.6, 20, 20))
    stalls = longest_stalls(samples, 0.0, 2.0)
    assert stalls[A] == 1.4
    assert stalls[B] == 0.0


def test_a_caught_up_partition_whose_offset_stands_still_does_not_stall() -> None:
    samples = offsets((0.0, 10, 10), (1.0, 10, 10), (2.0, 10, 11), (2.2, 11, 11))
    assert longest_stalls(samples, 0.0, 3.0)[A] == pytest.approx(0.2)


def test_a_stall_still_running_at_the_window_end_counts_up_to_the_last_sample() -> None:
    samples = offsets((0.0, 10, 10), (1.0, 10, 15), (3.0, 10, 30), (9.0, 10, 40))
    assert longest_stalls(samples, 0.0, 3.5)[A] == 2.0


def test_stalls_split_by_partitions_that_moved_and_that_stayed() -> None:
    before = {0: "http://a", 1: "http://b", 2: "http://a"}
    after = {0: "http://a", 1: "http://c", 2: "http://c"}
    assert moved(before, after) == {1, 2}
    split = split_stalls({A: 0.3, B: 4.0, ("item-events", 0): 0.6}, {1, 2}, 3)
    assert split["stayed"] == {0: 0.6}
    assert split["moved"] == {1: 4.0, 2: 0.0}
    assert (split["stayed_max_s"], split["moved_max_s"]) == (0.6, 4.0)
    assert split["by_topic"] == {
        "stayed": {"text-lines": 0.3, "item-events": 0.6},
        "moved": {"text-lines": 4.0},
    }


def test_owners_come_from_the_active_changelog_partitions_of_each_host() -> None:
    metadata = {
        "hosts": [
            {"url": "http://a/", "active": {"c": [0, 2], "other": [1]}, "standby": {"c": [1]}},
            {"url": "http://b", "active": {"c": [1]}},
        ]
    }
    assert owners(metadata, ["c"]) == {0: "http://a", 2: "http://a", 1: "http://b"}


def test_p99_is_the_nearest_rank() -> None:
    assert p99_ms([0.001] * 99 + [0.5]) == 1.0
    assert p99_ms([0.001] * 98 + [0.5, 0.5]) == 500.0
    assert p99_ms([]) is None


def step(**changes: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "stayed": {0: 0.2},
        "moved": {1: 0.8},
        "stayed_max_s": 0.2,
        "moved_max_s": 0.8,
        "moved_partitions": [1],
        "samples": 50,
        "assignment_settled": True,
    }
    row.update(changes)
    return row


def scale(**changes: Any) -> dict[str, Any]:
    exact = TableDrift(keys_expected=3, traced=1).as_dict()
    figures: dict[str, Any] = {
        "rounds_planned": 1,
        "steps": [step(), step()],
        "steps_settled": 2,
        "steps_with_moves": 2,
        "stayed_longest_stall_s": 0.2,
        "moved_longest_stall_s": 0.8,
        "reads": 400,
        "reads_failed": 0,
        "failures": [],
        "agent_crashes": 0,
        "drift": {"exact": True, **{name: exact for name in checks.TABLES}},
        "losses": {"acked_records": 10, "acked_but_lost": 0, "records_out_of_sequence": 0},
        "load": {"level": LEVEL, "offered_lines_per_s": 1000, "offered_events_per_s": 100},
    }
    figures.update(changes)
    return figures


def failed(found: list[checks.Check]) -> list[str]:
    return [c.what for c in found if not c.ok]


def test_scaling_within_the_targets_passes() -> None:
    found = checks.scale(scale())
    assert failed(found) == []
    assert checks.verdict(found) == "pass"


def test_long_stalls_miss_the_targets_without_failing_the_guarantees() -> None:
    found = checks.scale(scale(stayed_longest_stall_s=1.9, moved_longest_stall_s=5.4))
    assert failed(found) == [
        "partitions that stayed stalled at most 0.5 s",
        "partitions that moved stalled at most 1 s",
    ]
    assert checks.verdict(found) == "target missed"


def test_a_failed_read_or_a_wrong_table_fails() -> None:
    wrong = TableDrift(keys_expected=3, traced=1, keys_wrong=1).as_dict()
    found = checks.scale(
        scale(reads_failed=1, drift={"exact": False, **{n: wrong for n in checks.TABLES}})
    )
    assert "no key read failed while the group scaled" in failed(found)
    assert (
        "every table and settled-sales equal the ground truth after the last step and "
        "catch-up" in failed(found)
    )
    assert checks.verdict(found) == "fail"


def test_a_step_that_moved_nothing_or_never_settled_fails() -> None:
    idle = scale(steps=[step(), step(moved_partitions=[], moved={})], steps_with_moves=1)
    assert failed(checks.scale(idle)) == [
        "every step moved some partitions and kept others, each sampled"
    ]
    stuck = scale(steps_settled=1)
    assert failed(checks.scale(stuck))[0].startswith("1 rounds of scaling out")
