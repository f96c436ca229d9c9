"""The semantics that the stream and the batch job share.

Pure functions only: tokenising, validating raw records, inventory arithmetic, window
assignment and sale enrichment. The workers call them per record, the nightly job per
row, and both test suites run them on the same inputs, so the two can never drift.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from core.models import ItemEvent, Payment, Product

#: Tumbling window size of sales_by_category, in milliseconds.
HOUR_MS = 3_600_000
#: Category of a sale whose sku is not in the product catalogue.
UNKNOWN_CATEGORY = "unknown"
#: Largest accepted record value by default, in bytes.
DEFAULT_MAX_BYTES = 64 * 1024

_NON_WORD = re.compile(r"\W+")
_ASCII_NON_WORD = re.compile(rb"\W+")

M = TypeVar("M", bound=BaseModel)


class InvalidEvent(ValueError):
    """A record that fails validation; ``reason`` says what is wrong, naming the field."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# -- words ---------------------------------------------------------------------------


def tokenize(line: str) -> list[str]:
    """The words of a line: ``re.split(r"\\W+", line.lower())`` without empty tokens.

    ``\\w`` is Unicode-aware here (letters and digits of every script, and ``_``).
    """
    return [token for token in _NON_WORD.split(line.lower()) if token]


def tokenize_bytes(raw: bytes) -> list[str]:
    """Tokens of a UTF-8 encoded line; ASCII lines take a faster path with equal tokens."""
    if raw.isascii():
        return [token.decode() for token in _ASCII_NON_WORD.split(raw.lower()) if token]
    return tokenize(raw.decode("utf-8"))


def decode_text_line(raw: bytes | None, max_bytes: int = DEFAULT_MAX_BYTES) -> str:
    """The text of a ``text-lines`` record, or InvalidEvent."""
    if raw is None:
        raise InvalidEvent("value: missing (null record value)")
    if len(raw) > max_bytes:
        raise InvalidEvent(f"value: {len(raw)} bytes exceeds the limit of {max_bytes}")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise InvalidEvent(f"value: not UTF-8 ({error.reason} at byte {error.start})") from None


def ascii_token_counts(lines: list[bytes]) -> Counter[bytes]:
    """How often each token occurs in ``lines`` (ASCII text, each a whole line).

    The lines are split as one text, joined by a space (a separator in every line), so
    the regular expression and the counting run once per batch instead of once per line.
    """
    counts = Counter(_ASCII_NON_WORD.split(b" ".join(lines).lower()))
    counts.pop(b"", None)
    return counts


# -- validation ----------------------------------------------------------------------


def _describe(error: ValidationError) -> str:
    parts = []
    for item in error.errors(include_url=False):
        field = ".".join(str(p) for p in item["loc"]) or "value"
        parts.append(f"{field}: {item['msg']}")
    return "; ".join(parts)


def parse_record(model: type[M], raw: bytes | None, max_bytes: int = DEFAULT_MAX_BYTES) -> M:
    """Validate one JSON record value against its wire schema, or raise InvalidEvent."""
    if raw is None:
        raise InvalidEvent("value: missing (null record value)")
    if len(raw) > max_bytes:
        raise InvalidEvent(f"value: {len(raw)} bytes exceeds the limit of {max_bytes}")
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise InvalidEvent(f"value: not UTF-8 ({error.reason} at byte {error.start})") from None
    try:
        return model.model_validate_json(raw)
    except ValidationError as error:
        raise InvalidEvent(_describe(error)) from None


def parse_item_event(raw: bytes | None, max_bytes: int = DEFAULT_MAX_BYTES) -> ItemEvent:
    return parse_record(ItemEvent, raw, max_bytes)


def parse_product(raw: bytes | None, max_bytes: int = DEFAULT_MAX_BYTES) -> Product:
    return parse_record(Product, raw, max_bytes)


def parse_payment(raw: bytes | None, max_bytes: int = DEFAULT_MAX_BYTES) -> Payment:
    return parse_record(Payment, raw, max_bytes)


def check_key(key: bytes | None, expected: str, field: str) -> None:
    """A keyed topic's record key must equal the field it is partitioned by."""
    if key is None:
        raise InvalidEvent(f"key: missing, expected the {field} {expected!r}")
    if key != expected.encode("utf-8"):
        shown = key.decode("utf-8", "replace")[:80]
        raise InvalidEvent(f"key: {shown!r} does not match {field} {expected!r}")


# -- inventory -----------------------------------------------------------------------


def stock_delta(event: ItemEvent) -> int:
    """How an event changes on-hand stock: sale subtracts, restock adds, adjust is signed."""
    return -event.quantity if event.kind == "sale" else event.quantity


def apply_inventory(state: Mapping[str, Any] | None, event: ItemEvent) -> dict[str, Any]:
    """The inventory value of a store after one event (a new dict; ``state`` is unchanged)."""
    on_hand: dict[str, int] = dict(state["on_hand"]) if state else {}
    on_hand[event.sku] = on_hand.get(event.sku, 0) + stock_delta(event)
    updated_at = max(int(state["updated_at"]), event.ts) if state else event.ts
    return {"store_id": event.store_id, "on_hand": on_hand, "updated_at": updated_at}


# -- sales by category ---------------------------------------------------------------


def window_start(ts_ms: int, size_ms: int = HOUR_MS) -> int:
    """Start (ms) of the tumbling window that holds ``ts_ms``."""
    return ts_ms - ts_ms % size_ms


def sale_revenue(event: ItemEvent) -> float:
    """quantity x unit_price of a sale."""
    return event.quantity * (event.unit_price or 0.0)


def category_of(product: Mapping[str, Any] | Product | None) -> str:
    """The category a sale is counted under."""
    if product is None:
        return UNKNOWN_CATEGORY
    if isinstance(product, Product):
        return product.category
    return str(product["category"])


def add_sale(total: Mapping[str, Any] | None, units: int, revenue: float) -> dict[str, Any]:
    """A sales_by_category value with one more sale."""
    if not total:
        return {"units": units, "revenue": revenue}
    return {"units": int(total["units"]) + units, "revenue": float(total["revenue"]) + revenue}
