"""The semantics that the stream and the batch job share.

Pure functions only: tokenising, validating raw records, inventory arithmetic, window
assignment and sale enrichment. The workers call them per record, the nightly job per
row, and both test suites run them on the same inputs, so the two can never drift.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Mapping
from typing import Any, NamedTuple, TypeVar

import orjson
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


class StoreEvent(NamedTuple):
    """A valid item event, as the stream reads it: the fields of :class:`ItemEvent` and
    the record as a JSON object text (as it was sent, unknown fields included, when it
    is strict JSON; else as Python's parser read it, written again)."""

    event_id: str
    store_id: str
    sku: str
    kind: str
    quantity: int
    unit_price: float | None
    ts: int
    json: bytes


class PaymentEvent(NamedTuple):
    """A valid payment, as the stream reads it (see :class:`StoreEvent`)."""

    payment_id: str
    sale_event_id: str
    store_id: str
    amount: float
    ts: int
    json: bytes


_KINDS = frozenset(("sale", "restock", "adjust"))
_MAX_TS = 253_402_300_799_999


def _text(value: Any) -> bool:
    return type(value) is str and 0 < len(value) <= 256


def _price(value: Any, high: float) -> float | None:
    """A finite number in [0, high] as a float, or None when it is not certainly one."""
    if (type(value) is float or type(value) is int) and 0 <= value <= high:  # NaN: False
        return float(value)
    return None


def _quick_item(data: Any, raw: bytes) -> StoreEvent | None:
    """The event when ``data`` is certainly valid by :class:`ItemEvent`'s rules; None
    when pydantic must judge it (to accept it, or to say exactly what is wrong)."""
    if type(data) is not dict:
        return None
    get: Any = data.get
    event_id, store_id, sku, kind = get("event_id"), get("store_id"), get("sku"), get("kind")
    quantity, ts = get("quantity"), get("ts")
    if not (_text(event_id) and _text(store_id) and _text(sku)):
        return None
    if type(kind) is not str or kind not in _KINDS:
        return None
    if type(quantity) is not int or not -1_000_000 <= quantity <= 1_000_000:
        return None
    if type(ts) is not int or not 0 <= ts <= _MAX_TS:
        return None
    price = data.get("unit_price")
    if price is not None and (price := _price(price, 1e9)) is None:
        return None
    if (quantity <= 0 and kind != "adjust") or quantity == 0:
        return None
    if kind == "sale" and price is None:
        return None
    return StoreEvent(event_id, store_id, sku, kind, quantity, price, ts, raw)


def _quick_payment(data: Any, raw: bytes) -> PaymentEvent | None:
    """As :func:`_quick_item`, for :class:`Payment`."""
    if type(data) is not dict:
        return None
    get: Any = data.get
    payment_id, sale_event_id = get("payment_id"), get("sale_event_id")
    store_id, ts = get("store_id"), get("ts")
    if not (_text(payment_id) and _text(sale_event_id) and _text(store_id)):
        return None
    if type(ts) is not int or not 0 <= ts <= _MAX_TS:
        return None
    amount = _price(data.get("amount"), 1e12)
    if amount is None:
        return None
    return PaymentEvent(payment_id, sale_event_id, store_id, amount, ts, raw)


def _strict_json(raw: bytes) -> bytes:
    """``raw`` when it is strict JSON; else what the standard library reads in it (it
    takes what pydantic accepted and orjson refuses: integers beyond 64 bits, NaN in
    unknown fields), written as strict JSON."""
    try:
        orjson.loads(raw)
    except orjson.JSONDecodeError:
        return json.dumps(_finite(json.loads(raw)), allow_nan=False).encode()
    return raw


def _finite(value: Any) -> Any:
    """``value`` with NaN and the infinities as null (as orjson writes them)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def read_item_event(raw: bytes | None, max_bytes: int = DEFAULT_MAX_BYTES) -> StoreEvent:
    """:func:`parse_item_event` for the stream's hot path: the same verdicts, values and
    reasons, without building a pydantic model for the events that are certainly valid."""
    if raw is not None and len(raw) <= max_bytes:
        try:
            quick = _quick_item(orjson.loads(raw), raw)
        except orjson.JSONDecodeError:
            quick = None
        if quick is not None:
            return quick
    event = parse_item_event(raw, max_bytes)
    assert raw is not None  # parse_item_event refuses a null value
    return StoreEvent(
        event.event_id,
        event.store_id,
        event.sku,
        event.kind,
        event.quantity,
        event.unit_price,
        event.ts,
        _strict_json(raw),
    )


def read_payment(raw: bytes | None, max_bytes: int = DEFAULT_MAX_BYTES) -> PaymentEvent:
    """:func:`parse_payment` for the stream's hot path (see :func:`read_item_event`)."""
    if raw is not None and len(raw) <= max_bytes:
        try:
            quick = _quick_payment(orjson.loads(raw), raw)
        except orjson.JSONDecodeError:
            quick = None
        if quick is not None:
            return quick
    payment = parse_payment(raw, max_bytes)
    assert raw is not None
    return PaymentEvent(
        payment.payment_id,
        payment.sale_event_id,
        payment.store_id,
        payment.amount,
        payment.ts,
        _strict_json(raw),
    )


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


def stock_delta(event: ItemEvent | StoreEvent) -> int:
    """How an event changes on-hand stock: sale subtracts, restock adds, adjust is signed."""
    return -event.quantity if event.kind == "sale" else event.quantity


def apply_inventory(
    state: Mapping[str, Any] | None, event: ItemEvent | StoreEvent
) -> dict[str, Any]:
    """The inventory value of a store after one event (a new dict; ``state`` is unchanged)."""
    working = working_inventory(state, event.store_id)
    add_to_inventory(working, event)
    return working


def working_inventory(state: Mapping[str, Any] | None, store_id: str) -> dict[str, Any]:
    """A copy of a store's inventory value that :func:`add_to_inventory` may change."""
    if not state:
        return {"store_id": store_id, "on_hand": {}, "updated_at": None}
    return {
        "store_id": store_id,
        "on_hand": dict(state["on_hand"]),
        "updated_at": int(state["updated_at"]),
    }


def add_to_inventory(working: dict[str, Any], event: ItemEvent | StoreEvent) -> None:
    """Apply one event to a :func:`working_inventory` value, in place."""
    on_hand = working["on_hand"]
    on_hand[event.sku] = on_hand.get(event.sku, 0) + (
        -event.quantity if event.kind == "sale" else event.quantity
    )
    updated_at = working["updated_at"]
    if updated_at is None or event.ts > updated_at:
        working["updated_at"] = event.ts


# -- sales by category ---------------------------------------------------------------


def window_start(ts_ms: int, size_ms: int = HOUR_MS) -> int:
    """Start (ms) of the tumbling window that holds ``ts_ms``."""
    return ts_ms - ts_ms % size_ms


def sale_revenue(event: ItemEvent | StoreEvent) -> float:
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
