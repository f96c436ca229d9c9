"""Records written through the API, checked by the stream's own rules before they go out.

Each source topic's record is validated with the functions of :mod:`core.semantics` that
its pipeline applies when it reads the record, on the exact bytes that will be produced,
so a record accepted here is never dead-lettered by the stream.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from api.schemas import ProduceRecord
from core.semantics import (
    InvalidEvent,
    check_key,
    decode_text_line,
    parse_item_event,
    parse_payment,
    parse_product,
)
from core.topics import ITEM_EVENTS, PAYMENTS, PRODUCTS, TEXT_LINES


@dataclass(frozen=True)
class Outgoing:
    """One record as it will be produced: raw key and value bytes."""

    key: bytes | None
    value: bytes | None


#: (key, value, max_bytes) -> the record to produce, or InvalidEvent.
Check = Callable[[str | None, Any, int], Outgoing]


def _utf8(text: str, field: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise InvalidEvent(f"{field}: not UTF-8 (lone surrogate at {error.start})") from None


def _json(value: Any) -> bytes:
    try:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except ValueError:
        raise InvalidEvent("value: NaN and Infinity are not JSON numbers") from None
    return _utf8(text, "value")


def _text_line(key: str | None, value: Any, max_bytes: int) -> Outgoing:
    if not isinstance(value, str):
        raise InvalidEvent(f"value: a text line is a JSON string, not {_kind(value)}")
    raw = _utf8(value, "value")
    decode_text_line(raw, max_bytes)
    return Outgoing(None if key is None else _utf8(key, "key"), raw)


def _keyed(parse: Callable[[bytes, int], BaseModel], field: str) -> Check:
    """The check of a topic keyed by ``field`` of its value; a null key becomes it."""

    def check(key: str | None, value: Any, max_bytes: int) -> Outgoing:
        raw = _json(value)
        expected = str(getattr(parse(raw, max_bytes), field))
        raw_key = expected.encode("utf-8") if key is None else _utf8(key, "key")
        check_key(raw_key, expected, field)
        return Outgoing(raw_key, raw)

    return check


def _product(key: str | None, value: Any, max_bytes: int) -> Outgoing:
    if value is None:  # a tombstone: the stream deletes the product named by the key
        if not key:
            raise InvalidEvent("key: a null value deletes a product, and needs its sku as key")
        return Outgoing(_utf8(key, "key"), None)
    return _keyed(parse_product, "sku")(key, value, max_bytes)


CHECKS: dict[str, Check] = {
    TEXT_LINES: _text_line,
    ITEM_EVENTS: _keyed(parse_item_event, "store_id"),
    PAYMENTS: _keyed(parse_payment, "store_id"),
    PRODUCTS: _product,
}


def prepare(
    topic: str, records: Sequence[Any], max_bytes: int
) -> tuple[list[Outgoing], list[tuple[int, str]]]:
    """The records to produce to ``topic``, and (index, reason) of every invalid one.

    ``records`` are :class:`ProduceRecord` objects, or the JSON of such objects (when
    the body as a whole did not validate, every record is still looked at).
    """
    check = CHECKS[topic]
    ready: list[Outgoing] = []
    problems: list[tuple[int, str]] = []
    for index, item in enumerate(records):
        try:
            record = ProduceRecord.model_validate(item)
            ready.append(check(record.key, record.value, max_bytes))
        except ValidationError as error:
            problems.append((index, _describe(error)))
        except InvalidEvent as error:
            problems.append((index, error.reason))
    return ready, problems


def _describe(error: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in item['loc']) or 'record'}: {item['msg']}"
        for item in error.errors(include_url=False)
    )


def _kind(value: Any) -> str:
    names = {dict: "an object", list: "an array", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number")
