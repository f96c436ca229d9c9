"""The checks of the chaos scenarios of refused records (chaos/scenarios/refusals.py): each
fails when what it names goes wrong, and the truth leaves out the dead-lettered records."""

from __future__ import annotations

import copy
from types import SimpleNamespace
from typing import Any

import orjson
import pytest

from chaos.scenarios import refusals
from chaos.scenarios.refusals import INVENTORY_LIMIT, RefusedTruth

TABLES = ("word_counts", "inventory", "sales_by_category", "unsettled_sales", "settled-sales")
SIZE = "MessageSizeTooLargeError: the record is 1,054 bytes as a record batch; topic t"


def injected(label: str, partition: int, offset: int, topic: str = "payments") -> dict[str, Any]:
    return {
        "topic": topic,
        "partition": partition,
        "offset": offset,
        "acked_at": 0.0,
        "label": label,
    }


def letter(record: dict[str, Any], error: str = SIZE, key: str = "s") -> dict[str, Any]:
    return {
        "topic": record["topic"],
        "partition": record["partition"],
        "offset": record["offset"],
        "error": error,
        "key": key,
    }


def passing(fault: str = "output_refused", guarantee: str = "exactly_once") -> dict[str, Any]:
    """Figures of a run where everything went right."""
    records = [
        injected("control", 3, 10),
        injected("large payment", 3, 11),
        injected("fits payment", 3, 12),
    ]
    return {
        "guarantee": guarantee,
        "fault": fault,
        "injected": records,
        "moved_after_s": [0.4, 0.5, 0.5],
        "dead_letters": [letter(records[1])],
        "acked_records": 5000,
        "acked_but_lost": 0,
        "drift": {"exact": True, **{t: {"over": 0, "under": 0} for t in TABLES}},
        "settled_repeats": 0,
        "settled_max_copies": 1,
        "workers": {"retries_refusal": 1.0, "retries_backoff": 0.0},
        "ready_at_end": [{"status": "ready", "stalled": []}],
        "grown": None,
    }


def failed(figures: dict[str, Any]) -> list[str]:
    return [c.what for c in refusals.check(figures) if not c.ok]


def test_a_run_where_everything_went_right_passes() -> None:
    assert failed(passing()) == []


def test_a_lost_load_record_fails() -> None:
    figures = passing()
    figures["acked_but_lost"] = 1
    assert failed(figures) == ["lost 0 of 5,000 acknowledged load records"]


def test_an_offending_record_that_held_its_partition_misses_the_target() -> None:
    figures = passing()
    figures["moved_after_s"] = [0.4, 6.5, 6.5]
    assert [c.target for c in refusals.check(figures) if not c.ok] == [True, True]
    figures["moved_after_s"] = [0.4, None, None]
    assert len(failed(figures)) == 2


def test_a_partition_that_lags_anyway_misses_only_the_absolute_target() -> None:
    figures = passing()
    figures["moved_after_s"] = [9.0, 9.0, 9.0]
    [missed] = [c for c in refusals.check(figures) if not c.ok]
    assert missed.target
    assert missed.what.startswith("every offending record's partition moved past it")
    assert refusals.stood(figures) == [0.0]


@pytest.mark.parametrize(
    "wrong",
    ["missing", "another record", "no Kafka reason"],
)
def test_the_dead_letters_must_be_the_offending_inputs_with_kafkas_reason(wrong: str) -> None:
    figures = passing()
    if wrong == "missing":
        figures["dead_letters"] = []
    elif wrong == "another record":
        figures["dead_letters"].append(letter(figures["injected"][2]))
    else:
        figures["dead_letters"] = [letter(figures["injected"][1], "processing failed: boom")]
    assert failed(figures) == [
        "every offending input in its dead-letter topic with Kafka's reason, and no other record"
    ]


def test_a_valid_event_in_a_dead_letter_topic_fails_the_event_time_run() -> None:
    figures = passing("event_time")
    figures["dead_letters"] = []
    assert failed(figures) == []
    figures["dead_letters"] = [letter(figures["injected"][1], "InvalidTimestampError: x")]
    assert failed(figures) == ["no valid event in a dead-letter topic, whatever its event time"]


def test_a_repeated_pair_fails_exactly_once_and_is_bounded_under_at_least_once() -> None:
    figures = passing()
    figures["settled_repeats"], figures["settled_max_copies"] = 1, 2
    assert failed(figures) == ["no settled pair written twice"]
    alo = passing(guarantee="at_least_once")
    alo["settled_repeats"], alo["settled_max_copies"] = 1, 2  # one attempt again: allowed
    assert failed(alo) == []
    alo["settled_max_copies"] = 3
    assert failed(alo) == [
        "a settled pair written at most once more per attempt at its cycle (1 attempts again)"
    ]


def test_a_table_off_the_truth_fails() -> None:
    figures = passing()
    figures["drift"]["exact"] = False
    assert len(failed(figures)) == 1
    alo = passing(guarantee="at_least_once")
    alo["drift"]["inventory"]["under"] = 2
    assert len(failed(alo)) == 1


def test_a_stall_left_at_the_end_fails() -> None:
    figures = passing()
    figures["ready_at_end"] = [{"status": "ready", "stalled": [{"partition": 3}]}]
    assert failed(figures) == ["/ready 200 with no stalled partition at the end"]


def growth(refused: list[int]) -> dict[str, Any]:
    """Figures of the growing store whose growth skus ``refused`` went to the DLQ."""
    figures = passing("state_too_large")
    records = [injected("control", 1, 0, "item-events")]
    records += [injected(f"growth {n}", 1, n + 1, "item-events") for n in range(9000)]
    figures["injected"] = records
    figures["moved_after_s"] = [0.2] * len(records)
    figures["dead_letters"] = [letter(records[n + 1], key="store-grow") for n in refused]
    kept = set(range(9000)) - set(refused)
    figures["grown"] = {
        "skus_kept": len(kept),
        "last_kept": max(kept),
        "changelog_record_bytes": INVENTORY_LIMIT - 10,
        "refused": len(refused),
    }
    return figures


def test_the_growing_store_must_refuse_exactly_the_skus_past_its_limit() -> None:
    assert failed(growth(list(range(6000, 9000)))) == []
    name = (
        f"the growing store kept its skus up to {INVENTORY_LIMIT:,} bytes and refused each "
        "later one"
    )
    assert failed(growth([5000, *range(6001, 9000)])) == [name]  # refused, then kept others
    too_large = growth(list(range(6000, 9000)))
    too_large["grown"]["changelog_record_bytes"] = INVENTORY_LIMIT + 1
    assert failed(too_large) == [name]


def record(offset: int, value: dict[str, Any] | None, seq: int) -> SimpleNamespace:
    raw = None if value is None else orjson.dumps(value)
    return SimpleNamespace(
        offset=offset, value=raw, key=b"store-1", headers=[("chaos-seq", str(seq).encode())]
    )


def test_the_truth_leaves_out_the_dead_letters_and_still_follows_the_sequence() -> None:
    events = [
        {
            "event_id": f"e{n}",
            "store_id": "store-1",
            "sku": "RST-1",
            "kind": "restock",
            "quantity": 1 + n,
            "ts": 1_764_000_000_000,
        }
        for n in range(3)
    ]
    truth = RefusedTruth(excluded={("item-events", 0, 1)})
    truth.add_events(0, [record(n, e, n) for n, e in enumerate(events)])
    assert truth.inventory["store-1"]["on_hand"] == {"RST-1": 1 + 3}
    assert truth.runs[("item-events", 0)].out_of_sequence == 0
    assert truth.runs[("item-events", 0)].holds(0, 0, 3)


def test_the_truth_counts_no_sale_in_an_expired_window() -> None:
    sale = {
        "event_id": "s",
        "store_id": "store-1",
        "sku": "DAI-1",
        "kind": "sale",
        "quantity": 2,
        "unit_price": 0.5,
    }
    truth = RefusedTruth()
    truth.add_events(0, [record(0, {**sale, "ts": 1_000}, 0)])
    assert truth.sales == {}
    recent = copy.deepcopy(sale)
    recent["event_id"], recent["ts"] = "t", 4_102_444_800_000  # the year 2100
    truth.add_events(0, [record(1, recent, 1)])
    assert list(truth.sales.values()) == [[2, 1.0]]
