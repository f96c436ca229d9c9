"""The shared semantics: tokens, validation, inventory arithmetic, windows."""

from __future__ import annotations

import re
from collections import Counter

import orjson
import pytest

from core.models import ItemEvent
from core.semantics import (
    HOUR_MS,
    InvalidEvent,
    add_sale,
    apply_inventory,
    ascii_token_counts,
    category_of,
    check_key,
    decode_text_line,
    parse_item_event,
    parse_payment,
    parse_product,
    sale_revenue,
    stock_delta,
    tokenize,
    tokenize_bytes,
    window_start,
)


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
    assert tokenize(line) == tokens
    assert tokenize(line) == [t for t in re.split(r"\W+", line.lower()) if t]


@pytest.mark.parametrize(
    "line",
    ["ASCII only, with_underscores and 42 digits!", "état straße ΣΟΦΙΑ", "tab\tand\nnewline", ""],
)
def test_tokenize_bytes_equals_tokenize_of_the_decoded_text(line: str) -> None:
    assert tokenize_bytes(line.encode("utf-8")) == tokenize(line)


def test_a_batch_of_ascii_lines_counts_the_tokens_of_each_line() -> None:
    # Joined for one split: a token at the end of a line must not run into the next one.
    lines = [b"end", b"start and end", b"", b"  -- ", b"x_1 X_1 09:30", b"end"]
    want = Counter(t for line in lines for t in tokenize(line.decode()))
    got = ascii_token_counts(lines)
    assert {k.decode(): v for k, v in got.items()} == want
    assert got[b"end"] == 3
    assert b"" not in got
    assert ascii_token_counts([]) == Counter()


def test_text_line_must_be_utf8_and_not_oversize() -> None:
    assert decode_text_line("état".encode()) == "état"
    with pytest.raises(InvalidEvent, match="not UTF-8"):
        decode_text_line(b"\xff\xfeabc")
    with pytest.raises(InvalidEvent, match="exceeds the limit"):
        decode_text_line(b"x" * 101, max_bytes=100)
    with pytest.raises(InvalidEvent, match="missing"):
        decode_text_line(None)


def test_a_valid_sale_parses() -> None:
    event = parse_item_event(orjson.dumps(sale()))
    assert event == ItemEvent.model_validate(sale())


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
    product = parse_product(b'{"sku": "A-1", "name": "milk", "category": "dairy"}')
    assert category_of(product) == "dairy"
    payment = parse_payment(
        b'{"payment_id": "p", "sale_event_id": "e", "store_id": "s", "amount": 3, "ts": 5}'
    )
    assert payment.amount == 3.0
    with pytest.raises(InvalidEvent, match="category"):
        parse_product(b'{"sku": "A-1", "name": "milk"}')


def test_record_key_must_match_the_partitioning_field() -> None:
    check_key(b"store-001", "store-001", "store_id")
    with pytest.raises(InvalidEvent, match="does not match store_id"):
        check_key(b"store-002", "store-001", "store_id")
    with pytest.raises(InvalidEvent, match="key: missing"):
        check_key(None, "store-001", "store_id")


def test_sale_reduces_on_hand_restock_adds_adjust_is_signed() -> None:
    restock = ItemEvent.model_validate(sale(kind="restock", quantity=10, unit_price=None, ts=1))
    sold = ItemEvent.model_validate(sale(quantity=3, ts=3))
    shrink = ItemEvent.model_validate(sale(kind="adjust", quantity=-2, unit_price=None, ts=2))
    state = apply_inventory(None, restock)
    state = apply_inventory(state, sold)
    state = apply_inventory(state, shrink)
    assert state == {"store_id": "store-001", "on_hand": {"DAI-0001": 5}, "updated_at": 3}
    assert [stock_delta(e) for e in (restock, sold, shrink)] == [10, -3, -2]


def test_apply_inventory_does_not_mutate_the_previous_state() -> None:
    before = {"store_id": "store-001", "on_hand": {"DAI-0001": 1}, "updated_at": 1}
    apply_inventory(before, ItemEvent.model_validate(sale()))
    assert before["on_hand"] == {"DAI-0001": 1}


def test_window_start_is_the_hour_that_holds_the_time() -> None:
    assert window_start(0) == 0
    assert window_start(HOUR_MS - 1) == 0
    assert window_start(HOUR_MS) == HOUR_MS
    assert window_start(1_700_000_123_456) == 1_699_999_200_000


def test_sales_add_units_and_revenue() -> None:
    event = ItemEvent.model_validate(sale(quantity=3, unit_price=2.5))
    assert sale_revenue(event) == 7.5
    total = add_sale(None, 3, 7.5)
    assert add_sale(total, 1, 0.5) == {"units": 4, "revenue": 8.0}
    assert add_sale({}, 1, 1.0) == {"units": 1, "revenue": 1.0}


def test_unknown_sku_counts_as_unknown_category() -> None:
    assert category_of(None) == "unknown"
    assert category_of({"sku": "A", "name": "n", "category": "bakery"}) == "bakery"
