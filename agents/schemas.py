"""The demo pipelines' topics and the schemas of their records.

Each source's value type validates strictly with a pydantic model, and reads the records
that are certainly valid without building the model (``read_item_event``,
``read_payment``): the same verdicts, values and reasons, faster. The produce endpoint,
the stream and the nightly job all validate with these types.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Annotated, Any, Literal

import msgspec
import orjson
from msgspec import Meta, Struct
from pydantic import BaseModel, ConfigDict, Field, StrictInt, model_validator

from core.topics import TopicSpec, topic_specs
from core.values import DEFAULT_MAX_BYTES, Model, parse_model, read_each

TEXT_LINES = "text-lines"
ITEM_EVENTS = "item-events"
PRODUCTS = "products"
PAYMENTS = "payments"
SETTLED_SALES = "settled-sales"
#: The topics records of the demo come in through.
SOURCE_TOPICS = (TEXT_LINES, ITEM_EVENTS, PRODUCTS, PAYMENTS)


def demo_topic_specs(partitions: int, retention_ms: int) -> list[TopicSpec]:
    """The demo's topics as a worker creates them (for tools that write before one runs):
    its sources with their dead-letter topics, the corrections topic and the output."""
    specs = topic_specs(SOURCE_TOPICS, (PRODUCTS,), partitions, retention_ms)
    retained = {"retention.ms": str(retention_ms), "cleanup.policy": "delete"}
    return [*specs, TopicSpec(SETTLED_SALES, partitions, retained)]


NonEmpty = Annotated[str, Field(min_length=1, max_length=256)]
EpochMs = Annotated[StrictInt, Field(ge=0, le=253_402_300_799_999)]  # up to year 9999


class _Wire(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, strict=True)


class ItemEvent(_Wire):
    """A store event on ``item-events``: a sale, a restock or a stock adjustment."""

    event_id: NonEmpty
    store_id: NonEmpty
    sku: NonEmpty
    kind: Literal["sale", "restock", "adjust"]
    quantity: Annotated[StrictInt, Field(ge=-1_000_000, le=1_000_000)]
    unit_price: Annotated[float, Field(allow_inf_nan=False, ge=0, le=1e9)] | None = None
    ts: EpochMs

    @model_validator(mode="after")
    def _check_kind(self) -> ItemEvent:
        if self.kind in ("sale", "restock") and self.quantity <= 0:
            raise ValueError(f"quantity must be > 0 for {self.kind}, got {self.quantity}")
        if self.kind == "adjust" and self.quantity == 0:
            raise ValueError("quantity must be non-zero for adjust")
        if self.kind == "sale" and self.unit_price is None:
            raise ValueError("unit_price is required for a sale")
        return self


class Product(_Wire):
    """A catalogue record on the compacted ``products`` topic."""

    sku: NonEmpty
    name: Annotated[str, Field(max_length=1024)]
    category: NonEmpty


class Payment(_Wire):
    """A payment on ``payments``, settling the sale whose event_id is sale_event_id."""

    payment_id: NonEmpty
    sale_event_id: NonEmpty
    store_id: NonEmpty
    amount: Annotated[float, Field(allow_inf_nan=False, ge=0, le=1e12)]
    ts: EpochMs


_Text = Annotated[str, Meta(min_length=1, max_length=256)]
_Time = Annotated[int, Meta(ge=0, le=253_402_300_799_999)]


class StoreEvent(Struct, gc=False):
    """A valid item event, as the stream reads it: the fields of :class:`ItemEvent` and
    the record as a JSON object text (as it was sent, unknown fields included, when it
    is strict JSON; else as Python's parser read it, written again).

    msgspec reads an event that is certainly valid by :class:`ItemEvent`'s rules in one
    pass of C; any other goes to pydantic, to be accepted or refused with its reason.
    """

    event_id: _Text
    store_id: _Text
    sku: _Text
    kind: Literal["sale", "restock", "adjust"]
    quantity: Annotated[int, Meta(ge=-1_000_000, le=1_000_000)]
    ts: _Time
    unit_price: Annotated[float, Meta(ge=0, le=1e9)] | None = None
    json: bytes = b""


class PaymentEvent(Struct, gc=False):
    """A valid payment, as the stream reads it (see :class:`StoreEvent`)."""

    payment_id: _Text
    sale_event_id: _Text
    store_id: _Text
    amount: Annotated[float, Meta(ge=0, le=1e12)]
    ts: _Time
    json: bytes = b""


_ITEMS = msgspec.json.Decoder(StoreEvent)
_PAYMENTS = msgspec.json.Decoder(PaymentEvent)


def _quick_item(raw: bytes) -> StoreEvent | None:
    """The event when ``raw`` is certainly valid by :class:`ItemEvent`'s rules; None
    when pydantic must judge it (to accept it, or to say exactly what is wrong)."""
    try:
        event = _ITEMS.decode(raw)
    except (msgspec.DecodeError, ValueError, RecursionError):  # not UTF-8, too deep
        return None
    quantity, kind = event.quantity, event.kind
    if (quantity <= 0 and kind != "adjust") or quantity == 0:
        return None
    if kind == "sale" and event.unit_price is None:
        return None
    event.json = raw
    return event


def _quick_payment(raw: bytes) -> PaymentEvent | None:
    """As :func:`_quick_item`, for :class:`Payment`."""
    try:
        payment = _PAYMENTS.decode(raw)
    except (msgspec.DecodeError, ValueError, RecursionError):
        return None
    payment.json = raw
    return payment


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
    """The validation of :class:`ItemEvent` for the stream's hot path: the same verdicts, values and
    reasons, without building a pydantic model for the events that are certainly valid."""
    if raw is not None and len(raw) <= max_bytes:
        quick = _quick_item(raw)
        if quick is not None:
            return quick
    event = parse_model(ItemEvent, raw, max_bytes)
    assert raw is not None  # parse_model refuses a null value
    return StoreEvent(
        event.event_id,
        event.store_id,
        event.sku,
        event.kind,
        event.quantity,
        event.ts,
        event.unit_price,
        _strict_json(raw),
    )


def read_item_events(raws: Sequence[bytes | None], max_bytes: int) -> list[Any]:
    """:func:`read_item_event` of each value of a batch (an :class:`InvalidEvent` in the
    place of each it refuses): msgspec over the whole batch in one call when every value
    decodes, the rules checked per event, and one at a time otherwise."""
    events = _decoded(_ITEMS, raws, max_bytes)
    if events is None:
        return read_each(read_item_event, raws, max_bytes)
    for n, (event, raw) in enumerate(zip(events, raws, strict=True)):
        quantity, kind = event.quantity, event.kind
        if (
            (quantity <= 0 and kind != "adjust")
            or quantity == 0
            or (kind == "sale" and event.unit_price is None)
        ):
            events[n] = read_each(read_item_event, [raw], max_bytes)[0]
        else:
            event.json = raw
    return events


def read_payments(raws: Sequence[bytes | None], max_bytes: int) -> list[Any]:
    """:func:`read_payment` of each value of a batch (as :func:`read_item_events`)."""
    payments = _decoded(_PAYMENTS, raws, max_bytes)
    if payments is None:
        return read_each(read_payment, raws, max_bytes)
    for payment, raw in zip(payments, raws, strict=True):
        payment.json = raw
    return payments


def _decoded(
    decoder: msgspec.json.Decoder[Any], raws: Sequence[bytes | None], max_bytes: int
) -> list[Any] | None:
    """Every value decoded, or None when one is null, too large or not read by msgspec
    (it must then be judged on its own)."""
    try:
        if max(map(len, raws), default=0) > max_bytes:  # type: ignore[arg-type]
            return None
        return list(map(decoder.decode, raws))  # type: ignore[arg-type]
    except (msgspec.DecodeError, ValueError, RecursionError, TypeError):  # TypeError: null
        return None


def read_payment(raw: bytes | None, max_bytes: int = DEFAULT_MAX_BYTES) -> PaymentEvent:
    """The validation of :class:`Payment` for the stream's hot path (as
    :func:`read_item_event`)."""
    if raw is not None and len(raw) <= max_bytes:
        quick = _quick_payment(raw)
        if quick is not None:
            return quick
    payment = parse_model(Payment, raw, max_bytes)
    assert raw is not None
    return PaymentEvent(
        payment.payment_id,
        payment.sale_event_id,
        payment.store_id,
        payment.amount,
        payment.ts,
        _strict_json(raw),
    )


ITEM_EVENT: Model[StoreEvent] = Model(
    ItemEvent, reader=read_item_event, writer=lambda event: event.json, many=read_item_events
)
PAYMENT: Model[PaymentEvent] = Model(
    Payment, reader=read_payment, writer=lambda p: p.json, many=read_payments
)
PRODUCT: Model[Product] = Model(Product)
