"""The corrections agent's checks: key formats, routing and value validation."""

from __future__ import annotations

from datetime import timedelta

import orjson
import pytest
from agents.corrections import parse_window_key, plan, window_key
from core.semantics import HOUR_MS, InvalidEvent
from faust.serializers import codecs
from faust.windows import TumblingWindow

from tables.windows import window_key as table_window_key
from tables.windows import window_range

T0 = 1_700_000_000_000 - 1_700_000_000_000 % HOUR_MS


def record(**fields: object) -> bytes:
    return orjson.dumps(fields)


def test_window_key_names_category_and_window_start() -> None:
    assert window_key("dairy", T0) == f"dairy@{T0}"
    assert parse_window_key(f"fish@chips@{T0}") == ("fish@chips", T0)


@pytest.mark.parametrize("key", ["dairy", f"dairy@{T0 + 1}", f"@{T0}", "dairy@x", "dairy@"])
def test_window_key_must_be_a_category_and_an_hour_start(key: str) -> None:
    with pytest.raises(InvalidEvent, match="key"):
        parse_window_key(key)


def test_window_range_is_the_one_faust_keys_the_hour_by() -> None:
    window = TumblingWindow(timedelta(hours=1))
    for ts in (T0, T0 + 1, T0 + HOUR_MS - 1):
        assert window_range(T0) == window.ranges(ts / 1000)[0]


def test_window_table_key_is_the_json_faust_writes() -> None:
    window = TumblingWindow(timedelta(hours=1)).ranges(T0 / 1000)[0]
    assert table_window_key("café", T0) == codecs.dumps("json", ["café", list(window)])


def test_word_count_correction_is_routed_by_the_word() -> None:
    raw = record(table="word_counts", key="état", value=3, expected=7)
    assert plan("état".encode(), raw) == ("word_counts", "état".encode(), 3, True, 7)


def test_sales_correction_is_routed_by_the_category_and_sets_one_window() -> None:
    raw = record(table="sales_by_category", key=f"dairy@{T0}", value={"units": 2, "revenue": 3})
    name, key, value, has_expected, _ = plan(b"dairy", raw)
    assert (name, key) == ("sales_by_category", table_window_key("dairy", T0))
    assert value == {"units": 2, "revenue": 3.0}
    assert has_expected is False


def test_null_value_deletes_and_null_expected_means_absent() -> None:
    raw = record(table="inventory", key="s1", value=None, expected=None)
    assert plan(b"s1", raw) == ("inventory", b"s1", None, True, None)


@pytest.mark.parametrize(
    ("key", "fields", "reason"),
    [
        (b"dog", {"table": "word_counts", "key": "fox", "value": 1}, "raw key"),
        (b"fox", {"table": "products", "key": "fox", "value": 1}, "cannot be corrected"),
        (b"fox", {"table": "word_counts", "key": "fox", "value": "1"}, "value"),
        (b"fox", {"table": "word_counts", "key": "fox", "value": True}, "value"),
        (
            b"s1",
            {
                "table": "inventory",
                "key": "s1",
                "value": {"store_id": "s2", "on_hand": {}, "updated_at": 1},
            },
            "store_id",
        ),
        (b"s1", {"table": "inventory", "key": "s1", "value": {"on_hand": {"a": 1.5}}}, "value"),
        (b"d", {"table": "sales_by_category", "key": f"d@{T0}", "value": {"units": 1}}, "revenue"),
        (b"fox", {"key": "fox", "value": 1}, "table"),
    ],
)
def test_invalid_corrections_are_refused_naming_the_field(
    key: bytes, fields: dict[str, object], reason: str
) -> None:
    with pytest.raises(InvalidEvent, match=reason):
        plan(key, orjson.dumps(fields))


def test_a_correction_that_is_not_json_is_refused() -> None:
    with pytest.raises(InvalidEvent):
        plan(b"fox", b"not json")
