"""The demo pipelines' records and rules: tokens, validation, inventory arithmetic,
windows, and the fast readers that must agree with the schemas."""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.inventory import apply_event, empty_store, stock_change
from agents.sales import HOUR, UNKNOWN_CATEGORY, categorized, merge_totals
from agents.schemas import (
    ITEM_EVENT,
    PAYMENT,
    PRODUCT,
    ItemEvent,
    Payment,
    Product,
    read_item_event,
    read_item_events,
    read_payment,
    read_payments,
)
from agents.words import tokenize, tokenize_bytes
from core.values import InvalidEvent, Text, check_key, parse_model
from streams import Tumbling

HOUR_MS = 3_600_000


def fields_of(value: Any) -> dict[str, Any]:
    """A value the stream read, as a dict of its fields (its record text left out)."""
    return {name: getattr(value, name) for name in value.__struct_fields__ if name != "json"}


def parse_item_event(raw: bytes | None, max_bytes: int = 64 * 1024) -> ItemEvent:
    return parse_model(ItemEvent, raw, max_bytes)


def parse_payment(raw: bytes | None, max_bytes: int = 64 * 1024) -> Payment:
    return parse_model(Payment, raw, max_bytes)


def parse_product(raw: bytes | None, max_bytes: int = 64 * 1024) -> Product:
    return parse_model(Product, raw, max_bytes)


def sale(**fields: object) -> dict[str, object]:
    event: dict[str, object] = {
        "event_id": "e-1",
        "store_id": "store-001",
        "sku": "DAI-0001",
        "kind": "sale",
        "quantity": 2,
        "unit_price": 1.25,
        "ts": 1_700_000_000_000,
    }
    event.update(fields)
    return event


@pytest.mark.parametrize(
    ("line", "tokens"),
    [
        ("The quick brown fox", ["the", "quick", "brown", "fox"]),
        ("L'état du magasin", ["l", "état", "du", "magasin"]),
        ("Die Straße, STRASSE", ["die", "straße", "strasse"]),
        ("ΣΟΦΙΑ σοφία", ["σοφια", "σοφία"]),
        ("don't panic: user_42 at 09:30", ["don", "t", "panic", "user_42", "at", "09", "30"]),
        ("  --  ", []),
        ("", []),
        ("日本語のテキスト and ٣ digits", ["日本語のテキスト", "and", "٣", "digits"]),
    ],
)
def test_tokenize_lowercases_and_splits_on_unicode_non_word(line: str, tokens: list[str]) -> None:
    assert list(tokenize(line)) == tokens
    assert list(tokenize(line)) == [t for t in re.split(r"\W+", line.lower()) if t]


@pytest.mark.parametrize(
    "line",
    ["ASCII only, with_underscores and 42 digits!", "état straße ΣΟΦΙΑ", "tab\tand\nnewline", ""],
)
def test_tokenize_bytes_equals_tokenize_of_the_decoded_text(line: str) -> None:
    assert tokenize_bytes(line.encode("utf-8")) == list(tokenize(line))


def test_text_line_must_be_utf8_and_not_oversize() -> None:
    assert Text.parse("état".encode()) == "état"
    with pytest.raises(InvalidEvent, match="not UTF-8"):
        Text.parse(b"\xff\xfeabc")
    with pytest.raises(InvalidEvent, match="exceeds the limit"):
        Text.parse(b"x" * 101, max_bytes=100)
    with pytest.raises(InvalidEvent, match="missing"):
        Text.parse(None)


def test_a_valid_sale_parses() -> None:
    event = parse_item_event(orjson.dumps(sale()))
    assert event == ItemEvent.model_validate(sale())
    assert fields_of(ITEM_EVENT.parse(orjson.dumps(sale()))) == event.model_dump()


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"{not json", "Invalid JSON"),
        (orjson.dumps(sale(quantity="2")), "quantity"),
        (orjson.dumps(sale(quantity=2.5)), "quantity"),
        (orjson.dumps(sale(quantity=True)), "quantity"),
        (orjson.dumps(sale(quantity=0)), "quantity must be > 0 for sale"),
        (orjson.dumps(sale(kind="restock", quantity=-4)), "quantity must be > 0 for restock"),
        (orjson.dumps(sale(kind="adjust", quantity=0)), "non-zero for adjust"),
        (orjson.dumps(sale(unit_price=None)), "unit_price is required"),
        (orjson.dumps(sale(kind="refund")), "kind"),
        (orjson.dumps({k: v for k, v in sale().items() if k != "ts"}), "ts: Field required"),
        (orjson.dumps(sale(ts=-5)), "ts"),
        (orjson.dumps(sale(store_id="")), "store_id"),
        (b'{"event_id": "\xff"}', "not UTF-8"),
        (orjson.dumps([1, 2, 3]), "Input should be an object"),
    ],
)
def test_invalid_item_events_name_the_problem(raw: bytes, reason: str) -> None:
    with pytest.raises(InvalidEvent) as error:
        parse_item_event(raw)
    assert reason in error.value.reason


def test_oversize_records_are_refused_before_parsing() -> None:
    big = orjson.dumps(sale(event_id="x" * 200))
    with pytest.raises(InvalidEvent, match="exceeds the limit"):
        parse_item_event(big, max_bytes=100)


def test_products_and_payments_validate() -> None:
    product = PRODUCT.parse(b'{"sku": "A-1", "name": "milk", "category": "dairy"}')
    assert product.category == "dairy"
    payment = PAYMENT.parse(
        b'{"payment_id": "p", "sale_event_id": "e", "store_id": "s", "amount": 3, "ts": 5}'
    )
    assert payment.amount == 3.0
    with pytest.raises(InvalidEvent, match="category"):
        PRODUCT.parse(b'{"sku": "A-1", "name": "milk"}')


def test_record_key_must_match_the_partitioning_field() -> None:
    check_key(b"store-001", "store-001", "store_id")
    with pytest.raises(InvalidEvent, match="does not match store_id"):
        check_key(b"store-002", "store-001", "store_id")
    with pytest.raises(InvalidEvent, match="key: missing"):
        check_key(None, "store-001", "store_id")


def test_sale_reduces_on_hand_restock_adds_adjust_is_signed() -> None:
    restock = read_item_event(orjson.dumps(sale(kind="restock", quantity=10, ts=1)))
    sold = read_item_event(orjson.dumps(sale(quantity=3, ts=3)))
    shrink = read_item_event(orjson.dumps(sale(kind="adjust", quantity=-2, ts=2)))
    state = empty_store()
    for event in (restock, sold, shrink):
        state = apply_event("store-001", event, state)
    assert state == {"store_id": "store-001", "on_hand": {"DAI-0001": 5}, "updated_at": 3}
    assert [stock_change(e) for e in (restock, sold, shrink)] == [10, -3, -2]


def test_the_hour_window_is_the_hour_that_holds_the_time() -> None:
    hour = Tumbling(HOUR)
    assert hour.starts(0) == (0,)
    assert hour.starts(HOUR_MS - 1) == (0,)
    assert hour.starts(HOUR_MS) == (HOUR_MS,)
    assert hour.starts(1_700_000_123_456) == (1_699_999_200_000,)


def test_a_sale_counts_its_units_and_revenue_under_its_category() -> None:
    event = read_item_event(orjson.dumps(sale(quantity=3, unit_price=2.5)))
    product = Product(sku="DAI-0001", name="milk", category="dairy")
    assert categorized(event, product) == ("dairy", 3, 7.5)
    assert categorized(event, None).category == UNKNOWN_CATEGORY == "unknown"
    total = merge_totals("dairy", {"units": 3, "revenue": 7.5}, {"units": 1, "revenue": 0.5})
    assert total == {"units": 4, "revenue": 8.0}


# -- the stream's fast reading: the same verdicts as the pydantic schemas ---------------

_TEXTS = st.one_of(
    st.text(max_size=3),
    st.text(min_size=255, max_size=258),
    st.sampled_from(["", "e-1", "s", "\ud800x", "😀" * 256, "😀" * 257]),
)
#: Values at and beyond every bound of the schemas, and values of the wrong kind.
_WRONG = [None, "1", [], {}, float("nan"), float("inf"), -float("inf")]
_BOUNDS = {
    "quantity": [0, 1, -1, 3.0, 1_000_000, 1_000_001, -1_000_000, -1_000_001, 2**64],
    "unit_price": [0, 2, -0.0, -1e-9, 1e9, 1e9 + 1e-6, 10**9, 10**9 + 1, 5e-324, 2**70],
    "amount": [0, 2, -0.0, -1e-9, 1e12, 1e12 + 1, 10**12, 10**12 + 1, 2**70],
    "ts": [0, -1, 1.0, 253_402_300_799_999, 253_402_300_800_000, 2**63, 2**64],
    "kind": ["sale", "restock", "adjust", "Sale", "", 0],
}


def _field_values(name: str) -> st.SearchStrategy[object]:
    edges = st.sampled_from([*_BOUNDS.get(name, []), *_WRONG])
    numbers = st.one_of(st.integers(-(2**70), 2**70), st.floats())
    # Booleans apart: sampled_from takes True for the 1 it equals.
    return st.one_of(edges, edges, edges, st.booleans(), _TEXTS, numbers)


@st.composite
def _mutations(draw: st.DrawFn, names: list[str]) -> dict[str, object]:
    """One or two fields set to edge values."""
    chosen = draw(st.lists(st.sampled_from(names), min_size=1, max_size=2, unique=True))
    return {name: draw(_field_values(name)) for name in chosen}


def _json(fields: dict[str, object], drop: list[str], duplicate: str | None) -> bytes:
    """A JSON object; NaN and infinities as Python writes them, a key maybe twice."""
    parts = [
        f"{json.dumps(k)}: {json.dumps(v, allow_nan=True)}"
        for k, v in fields.items()
        if k not in drop
    ]
    if duplicate is not None and duplicate in fields:
        parts.insert(0, f'{json.dumps(duplicate)}: "first"')
    return ("{" + ", ".join(parts) + "}").encode("utf-8", "surrogatepass")


def _verdict(read: Any, raw: bytes) -> tuple[str, Any]:
    try:
        return "ok", read(raw)
    except InvalidEvent as error:
        return "bad", error.reason


@settings(max_examples=600, deadline=None)
@given(
    overrides=_mutations(["event_id", "store_id", "sku", "kind", "quantity", "unit_price", "ts"]),
    drop=st.lists(st.sampled_from(["unit_price", "quantity", "event_id", "ts"]), max_size=1),
    duplicate=st.one_of(st.none(), st.sampled_from(["event_id", "kind"])),
    extra=st.one_of(st.none(), st.booleans(), st.sampled_from([*_WRONG, 2**70])),
)
def test_read_item_event_agrees_with_the_schema(
    overrides: dict[str, object], drop: list[str], duplicate: str | None, extra: object
) -> None:
    fields = {**sale(), **overrides}
    if extra is not None:
        fields["note"] = extra
    raw = _json(fields, drop, duplicate)
    fast, schema = _verdict(read_item_event, raw), _verdict(parse_item_event, raw)
    assert fast[0] == schema[0], (fast, schema)
    if schema[0] == "bad":
        assert fast == schema
    else:
        assert fields_of(fast[1]) == schema[1].model_dump()
        assert type(fast[1].unit_price) is type(schema[1].unit_price)


@settings(max_examples=400, deadline=None)
@given(
    overrides=_mutations(["payment_id", "sale_event_id", "store_id", "amount", "ts"]),
    drop=st.lists(st.sampled_from(["amount", "ts", "payment_id"]), max_size=1),
)
def test_read_payment_agrees_with_the_schema(overrides: dict[str, object], drop: list[str]) -> None:
    fields: dict[str, object] = {
        "payment_id": "p-1",
        "sale_event_id": "e-1",
        "store_id": "store-001",
        "amount": 2.5,
        "ts": 1_700_000_000_000,
        **overrides,
    }
    raw = _json(fields, drop, None)
    fast, schema = _verdict(read_payment, raw), _verdict(parse_payment, raw)
    assert fast[0] == schema[0], (fast, schema)
    if schema[0] == "bad":
        assert fast == schema
    else:
        assert fields_of(fast[1]) == schema[1].model_dump()


def _one_by_one(read: Any, raws: list[bytes | None], max_bytes: int) -> list[Any]:
    found: list[Any] = []
    for raw in raws:
        try:
            found.append(read(raw, max_bytes))
        except InvalidEvent as error:
            found.append(error.reason)
    return found


def _reasons(values: list[Any]) -> list[Any]:
    return [v.reason if isinstance(v, InvalidEvent) else v for v in values]


@settings(max_examples=300, deadline=None)
@given(
    batch=st.lists(
        st.tuples(
            _mutations(["event_id", "store_id", "kind", "quantity", "unit_price"]),
            st.lists(st.sampled_from(["unit_price", "ts"]), max_size=1),
        ),
        min_size=1,
        max_size=6,
    ),
    odd=st.sampled_from([None, b"{not json", b"x" * 400, b'{"event_id": "\xff"}']),
    at=st.integers(min_value=0, max_value=6),
)
def test_a_batch_of_item_events_reads_as_each_read_alone(
    batch: list[tuple[dict[str, object], list[str]]], odd: bytes | None, at: int
) -> None:
    """The batch reader gives each record the value or the reason it gets alone: valid
    batches, batches with a refused event, a null, an oversize or an unreadable record."""
    raws: list[bytes | None] = [_json({**sale(), **fields}, drop, None) for fields, drop in batch]
    for candidate in (list(raws), [*raws[:at], odd, *raws[at:]]):
        assert _reasons(read_item_events(candidate, 300)) == _one_by_one(
            read_item_event, candidate, 300
        )
        assert _reasons(ITEM_EVENT.parse_many(candidate, 300)) == _one_by_one(
            read_item_event, candidate, 300
        )


def test_a_batch_refuses_each_event_the_rules_refuse_and_keeps_the_others() -> None:
    cases = [
        sale(),
        sale(kind="adjust", quantity=0),
        sale(kind="adjust", quantity=-2),
        sale(quantity=0),
        sale(kind="restock", quantity=-4),
        sale(unit_price=None),
        sale(kind="restock", quantity=3, unit_price=None),
    ]
    raws: list[bytes | None] = [orjson.dumps(case) for case in cases]
    read = _reasons(read_item_events(raws, 1000))
    assert read == _one_by_one(read_item_event, raws, 1000)
    assert [isinstance(value, str) for value in read] == [
        False, True, False, True, True, True, False
    ]  # fmt: skip
    assert [event.json for event in read if not isinstance(event, str)] == [
        raws[0], raws[2], raws[6]
    ]  # fmt: skip


def test_a_batch_of_payments_reads_as_each_read_alone() -> None:
    paid = {"payment_id": "p", "sale_event_id": "e", "store_id": "s", "amount": 2.5, "ts": 1}
    raws: list[bytes | None] = [orjson.dumps({**paid, "payment_id": f"p{n}"}) for n in range(4)]
    for candidate in (raws, [*raws, None], [*raws, orjson.dumps({**paid, "amount": -1})]):
        assert _reasons(read_payments(candidate, 1000)) == _one_by_one(
            read_payment, candidate, 1000
        )
    assert [p.json for p in read_payments(raws, 1000)] == raws


def test_a_batch_reader_that_fails_leaves_each_value_to_the_reader(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(raws: Any, max_bytes: int) -> list[Any]:
        raise RuntimeError("batch reader bug")

    raws: list[bytes | None] = [orjson.dumps(sale()), b"{not json"]
    failing = dataclasses.replace(ITEM_EVENT, many=broken, name="BrokenItemEvent")
    with caplog.at_level(logging.DEBUG, logger="core.values"):
        for _ in range(2):
            found = failing.parse_many(raws, 1000)
            assert _reasons(found) == _one_by_one(read_item_event, raws, 1000)
    said = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "core.values"]
    assert [level for level, _ in said] == [logging.WARNING, logging.DEBUG]
    assert "BrokenItemEvent: the batch reader raised on 2 records" in said[0][1]
    assert "RuntimeError: batch reader bug" in said[0][1]
    assert "later failures are logged at debug level" in said[0][1]
    short = dataclasses.replace(ITEM_EVENT, many=lambda raws, max_bytes: [])
    with pytest.raises(ValueError, match="gave 0 values for 2 records"):
        short.parse_many(raws, 1000)


def test_read_item_event_keeps_the_record_as_sent() -> None:
    fields = {k: v for k, v in sale().items() if k != "unit_price"}
    raw = b' {"note": "kept",  "unit_price": 2, ' + orjson.dumps(fields)[1:]
    event = read_item_event(raw)
    assert event.unit_price == 2.0
    assert type(event.unit_price) is float
    assert event.json == raw


def test_a_record_only_python_reads_is_kept_as_strict_json() -> None:
    # pydantic accepts a NaN and a 70-bit integer in unknown fields; orjson does not
    raw = orjson.dumps(sale())[:-1] + b', "note": NaN, "big": 1180591620717411303424}'
    event = read_item_event(raw)
    assert event.event_id == "e-1"
    assert json.loads(event.json) == {**sale(), "note": None, "big": 2**70}
    assert orjson.loads(event.json)["note"] is None  # strict: orjson reads it
