"""The records a repair publishes to ``corrections``, and how values are compared."""

from __future__ import annotations

import orjson
import pytest

from jobs.compare import same_json, same_value
from jobs.corrections import correction_record, corrections_for


def test_a_correction_is_keyed_by_the_key_as_utf8_and_names_the_live_value() -> None:
    key, value = correction_record("word_counts", "état", 3, 7)
    assert key == "état".encode()
    assert orjson.loads(value) == {"table": "word_counts", "key": "état", "value": 3, "expected": 7}


def test_a_windowed_correction_is_keyed_by_the_grouped_key_and_names_its_window() -> None:
    [(key, value)] = corrections_for("sales", "dairy", {"units": 2}, None, (0, 3_600_000), None)
    assert key == b"dairy"
    assert orjson.loads(value) == {
        "table": "sales",
        "key": "dairy",
        "value": {"units": 2},
        "expected": None,
        "window": {"start": 0, "end": 3_600_000},
    }


def test_a_key_the_batch_lacks_is_deleted_from_the_value_the_live_table_held() -> None:
    [(_, value)] = corrections_for("t", "k", None, {"a": 1}, None, None)
    assert orjson.loads(value) == {"table": "t", "key": "k", "value": None, "expected": {"a": 1}}


def test_a_live_value_that_cannot_be_read_is_replaced_whatever_it_is() -> None:
    [(_, value)] = corrections_for("t", "k", 5, "not json", None, None, live_readable=False)
    assert "expected" not in orjson.loads(value)


def test_a_session_that_ends_elsewhere_is_deleted_and_the_batchs_written() -> None:
    found = corrections_for("sessions", "u1", {"views": 3}, {"views": 2}, (10, 90), (10, 50))
    assert [orjson.loads(value) for _, value in found] == [
        {"table": "sessions", "key": "u1", "value": None, "expected": {"views": 2},
         "window": {"start": 10, "end": 50}},
        {"table": "sessions", "key": "u1", "value": {"views": 3}, "expected": None,
         "window": {"start": 10, "end": 90}},
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        (0.1 + 0.2 + 0.3, 0.3 + 0.2 + 0.1, True),
        (1e12, 1e12 + 1, True),
        (1e12, 1e12 + 10_000, False),
        (3, 3.0, True),
        (3, 4, False),
        (1e-12, 0.0, True),
        (True, 1, False),
        ({"a": 1, "b": [1.0, 2]}, {"b": [1, 2.0], "a": 1}, True),
        ({"a": 1}, {"a": 1, "b": None}, False),
        ([1, 2], [2, 1], False),
        ("x", "x", True),
        (None, 0, False),
    ],
)
def test_values_are_the_same_as_json_with_numbers_within_a_relative_tolerance(
    a: object, b: object, same: bool
) -> None:
    assert same_value(a, b) is same
    assert same_json(orjson.dumps(a), orjson.dumps(b)) is same


def test_values_that_are_not_json_are_the_same_only_as_identical_bytes() -> None:
    assert same_json(b"{oops", b"{oops")
    assert not same_json(b"{oops", b"{oops ")
    assert not same_json(None, b"1")
