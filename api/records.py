"""Records written through the API, checked by the stream's own rules before they go out.

Each record of a topic is checked with the value type its pipelines declare for it
(``SourceSpec``), on the exact bytes that will be produced, so a record accepted here is
never dead-lettered by the stream. A topic read with no declared type takes any value:
a JSON string as its UTF-8 text, anything else as JSON.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from api.queries import MAX_KEY_BYTES
from api.schemas import ProduceRecord
from core.values import Bytes, InvalidEvent, check_key, event_time, required_field, utf8
from tables.pipeline import SourceSpec


@dataclass(frozen=True)
class Outgoing:
    """One record as it will be produced: raw key and value bytes."""

    key: bytes | None
    value: bytes | None


def check(spec: SourceSpec | None, key: str | None, document: Any, max_bytes: int) -> Outgoing:
    """The record to produce for a client's key and JSON value, or InvalidEvent.

    A topic keyed by a field of its values takes that field as the key when the key is
    null, and refuses a key that differs from it; a null value is a deletion where the
    topic takes them (its key then required).
    """
    raw_key = None if key is None else utf8(key, "key")
    if document is None and spec is not None and spec.tombstones:
        return check_raw(spec, raw_key, None, max_bytes)
    value_type = Bytes if spec is None else spec.value
    return check_raw(spec, raw_key, value_type.from_json(document), max_bytes)


def check_raw(
    spec: SourceSpec | None, key: bytes | None, raw: bytes | None, max_bytes: int
) -> Outgoing:
    """A record's key and value bytes checked as the stream checks them: the record to
    produce (its key filled in from the value's key field when missing), or InvalidEvent."""
    if raw is None and spec is not None and spec.tombstones:
        if not key:
            field = f"its {spec.key}" if spec.key else "the key it deletes"
            raise InvalidEvent(f"key: a null value deletes a record, and needs {field} as key")
        return Outgoing(key, None)
    value_type = Bytes if spec is None else spec.value
    value = value_type.parse(raw, max_bytes)
    if spec is not None and spec.key is not None:
        expected = str(required_field(value, spec.key))
        if key is None:
            key = utf8(expected, "key")
        check_key(key, expected, spec.key)
    if spec is not None and spec.timestamp is not None:
        event_time(value, spec.timestamp)
    if key is not None and not 0 < len(key) <= MAX_KEY_BYTES:
        # A table keyed by it could not be read by this key (GET /tables/{t}/keys/{key}).
        raise InvalidEvent(
            f"key: {len(key)} bytes; a key is 1 to {MAX_KEY_BYTES} bytes, as reads take it"
        )
    return Outgoing(key, raw)


def prepare(
    spec: SourceSpec | None, records: Sequence[Any], max_bytes: int
) -> tuple[list[Outgoing], list[tuple[int, str]]]:
    """The records to produce, and (index, reason) of every invalid one.

    ``records`` are :class:`ProduceRecord` objects, or the JSON of such objects (when
    the body as a whole did not validate, every record is still looked at).
    """
    ready: list[Outgoing] = []
    problems: list[tuple[int, str]] = []
    for index, item in enumerate(records):
        try:
            record = ProduceRecord.model_validate(item)
            ready.append(check(spec, record.key, record.value, max_bytes))
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
