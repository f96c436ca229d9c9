"""The figures and checks of the chaos scenarios of refused records
(chaos/scenarios/refusals.py): each check fails when what it names goes wrong, and the
truth leaves out the dead-lettered records."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import orjson
import pytest

from chaos.scenarios import refusals
from chaos.scenarios.refusals import GROWING_STORE, INVENTORY_LIMIT, RefusedTruth, summarize

TABLES = ("word_counts", "inventory", "sales_by_category", "unsettled_sales", "settled-sales")
SIZE = "MessageSizeTooLargeError: the record is 1,054 bytes as a record batch; topic t"


def injected(label: str, offset: int, topic: str = "payments") -> dict[str, Any]:
    return {"topic": topic, "partition": 3, "offset": offset, "acked_at": 0.0, "label": label}


def letter(record: dict[str, Any], error: str = SIZE) -> dict[str, Any]:
    return {**{k: record[k] for k in ("topic", "partition", "offset")}, "error": error, "key": "s"}


RECORDS = [injected("control", 10), injected("large payment", 11), injected("fits payment", 12)]


def run(
    fault: str = "output_refused",
    guarantee: str = "exactly_once",
    *,
    records: list[dict[str, Any]] = RECORDS,
    moved: list[float | None] | None = None,
    letters: list[dict[str, Any]] | None = None,
    grown: Any = None,
) -> dict[str, Any]:
    """A run's figures: by default one where everything went right."""
    figures = summarize(
        fault,
        records,
        moved if moved is not None else [0.4] + [0.5] * (len(records) - 1),
        letters if letters is not None else [letter(RECORDS[1])],
        grown,
    )
    figures.update(
        guarantee=guarantee,
        fault=fault,
        acked_records=5000,
        acked_but_lost=0,
        drift={"exact": True, **{t: {"over": 0, "under": 0} for t in TABLES}},
        settled_repeats=0,
        settled_max_copies=1,
        workers={"retries_refusal": 1.0, "retries_backoff": 0.0},
        ready_at_end=[{"http": 200, "status": "ready", "stalled": 0}],
        ready={"longest_stall_s": 0.0},
        load={},
    )
    return figures


def failed(figures: dict[str, Any]) -> list[str]:
    return [c.what for c in refusals.check(figures) if not c.ok]


def test_a_run_where_everything_went_right_passes() -> None:
    figures = run()
    assert failed(figures) == []
    assert figures["later_than_control_s"] == {
        "median": 0.1,
        "max": 0.1,
        "never": 0,
        "over_target": 0,
    }
    assert refusals.headline(figures)


def test_a_lost_load_record_fails() -> None:
    figures = run()
    figures["acked_but_lost"] = 1
    assert failed(figures) == ["lost 0 of 5,000 acknowledged load records"]


def test_an_offending_record_that_held_its_partition_misses_both_targets() -> None:
    missed = [c for c in refusals.check(run(moved=[0.4, 6.5, 6.5])) if not c.ok]
    assert [c.target for c in missed] == [True, True]
    assert len(failed(run(moved=[0.4, None, 0.5]))) == 2


def test_a_partition_that_lags_anyway_misses_only_the_absolute_target() -> None:
    [missed] = [c for c in refusals.check(run(moved=[9.0, 9.0, 9.0])) if not c.ok]
    assert missed.target
    assert missed.what.startswith("every offending record's partition moved past it")


@pytest.mark.parametrize("wrong", ["missing", "another record", "no Kafka reason"])
def test_the_dead_letters_must_be_the_offending_inputs_with_kafkas_reason(wrong: str) -> None:
    letters = {
        "missing": [],
        "another record": [letter(RECORDS[1]), letter(RECORDS[2])],
        "no Kafka reason": [letter(RECORDS[1], "processing failed: boom")],
    }[wrong]
    assert failed(run(letters=letters)) == [
        "every offending input in its dead-letter topic with Kafka's reason, and no other record"
    ]


def test_a_valid_event_in_a_dead_letter_topic_fails_the_event_time_run() -> None:
    assert failed(run("event_time", letters=[])) == []
    assert failed(run("event_time", letters=[letter(RECORDS[1], "InvalidTimestampError: x")])) == [
        "no valid event in a dead-letter topic, whatever its event time"
    ]


def test_a_repeated_pair_fails_exactly_once_and_is_bounded_under_at_least_once() -> None:
    figures = run()
    figures["settled_repeats"], figures["settled_max_copies"] = 1, 2
    assert failed(figures) == ["no settled pair written twice"]
    alo = run(guarantee="at_least_once")
    alo["settled_repeats"], alo["settled_max_copies"] = 1, 2  # one attempt again: allowed
    assert failed(alo) == []
    alo["settled_max_copies"] = 3
    assert failed(alo) == [
        "a settled pair written at most once more per attempt at its cycle (1 attempts again)"
    ]


def test_a_table_off_the_truth_fails() -> None:
    figures = run()
    figures["drift"]["exact"] = False
    assert len(failed(figures)) == 1
    alo = run(guarantee="at_least_once")
    alo["drift"]["inventory"]["under"] = 2
    assert len(failed(alo)) == 1


def test_a_stall_left_at_the_end_fails() -> None:
    figures = run()
    figures["ready_at_end"] = [{"http": 503, "status": "stalled", "stalled": 1}]
    assert failed(figures) == ["/ready 200 with no stalled partition at the end"]


def growth(refused: list[int]) -> dict[str, Any]:
    """A run of the growing store whose growth skus ``refused`` went to the DLQ."""
    records = [injected("control", 0, "item-events")]
    records += [injected(f"growth {n}", n + 1, "item-events") for n in range(9000)]
    gone = set(refused)
    on_hand = {f"GROW-{n:06d}": 1 for n in range(9000) if n not in gone}
    value = {"store_id": GROWING_STORE, "on_hand": on_hand, "updated_at": 1}
    letters = [letter(records[n + 1]) for n in refused]
    return run("state_too_large", records=records, letters=letters, grown=value)


GROWTH = (
    f"the growing store kept its skus up to {INVENTORY_LIMIT:,} bytes and refused each later one"
)


def test_the_growing_store_must_refuse_exactly_the_skus_past_its_limit() -> None:
    passing = growth(list(range(5800, 9000)))
    assert failed(passing) == []
    assert passing["grown"]["skus_kept"] == 5800
    assert failed(growth([5000, *range(5801, 9000)])) == [GROWTH]  # refused, then kept
    too_large = growth(list(range(5800, 9000)))
    too_large["grown"]["changelog_record_bytes"] = INVENTORY_LIMIT + 1
    assert failed(too_large) == [GROWTH]


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
    truth.add_events(0, [record(1, {**sale, "event_id": "t", "ts": 4_102_444_800_000}, 1)])
    assert list(truth.sales.values()) == [[2, 1.0]]
