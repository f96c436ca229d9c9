"""Value types: how a topic's record values are read, checked and written.

A source declares the type of its values; the stream parses every record with it (a
record it refuses goes to ``<topic>-dlq`` with the reason), and the produce endpoint
checks a JSON body with the same type and writes the same bytes the stream will read.
A value that crosses a repartition topic or waits in a join's buffer is written and
read again with its stream's type.

Types: :data:`Text` (UTF-8 text), :data:`Json` (any JSON value), :data:`Bytes` (the raw
bytes), :class:`Model` (a pydantic model, validated strictly as its config says), or any
object with the methods of :class:`ValueType`.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

import orjson
from pydantic import BaseModel, TypeAdapter, ValidationError

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)
M = TypeVar("M", bound=BaseModel)

logger = logging.getLogger(__name__)

#: The value types whose batch reader raised: each is logged as a warning the first time.
_BATCH_READERS_FAILED: set[str] = set()

#: Largest accepted record value by default, in bytes.
DEFAULT_MAX_BYTES = 64 * 1024


class InvalidEvent(ValueError):
    """A record that fails validation; ``reason`` says what is wrong, naming the field."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@runtime_checkable
class ValueType(Protocol[T_co]):
    """How the values of a topic are read and written."""

    @property
    def name(self) -> str:
        """Shown in errors and in the API's description of a topic."""
        ...

    def parse(self, raw: bytes | None, max_bytes: int = DEFAULT_MAX_BYTES) -> T_co:
        """The value of a record, or :class:`InvalidEvent` saying what is wrong."""
        ...

    def encode(self, value: Any) -> bytes:
        """The record bytes of a value this type parsed (or built by a step)."""
        ...

    def from_json(self, document: Any) -> bytes:
        """The record bytes for a JSON document a client sent (the produce endpoint);
        :meth:`parse` is then run on them. :class:`InvalidEvent` if it cannot be one."""
        ...


def parse_each(
    parse: Callable[[bytes | None, int], Any], raws: Sequence[bytes | None], max_bytes: int
) -> list[Any]:
    """``parse`` of each value, an :class:`InvalidEvent` in the place of each it refuses."""
    found: list[Any] = []
    for raw in raws:
        try:
            found.append(parse(raw, max_bytes))
        except InvalidEvent as error:
            found.append(error)
    return found


def utf8(text: str, what: str = "value") -> bytes:
    """``text`` encoded, or InvalidEvent naming the lone surrogate."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise InvalidEvent(f"{what}: not UTF-8 (lone surrogate at {error.start})") from None


def check_size(raw: bytes | None, max_bytes: int) -> bytes:
    if raw is None:
        raise InvalidEvent("value: missing (null record value)")
    if len(raw) > max_bytes:
        raise InvalidEvent(f"value: {len(raw)} bytes exceeds the limit of {max_bytes}")
    return raw


def decode_utf8(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise InvalidEvent(f"value: not UTF-8 ({error.reason} at byte {error.start})") from None


def json_bytes(document: Any) -> bytes:
    """A JSON document as strict JSON text (UTF-8), as a client's JSON library writes it."""
    try:
        text = json.dumps(document, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except ValueError:
        raise InvalidEvent("value: NaN and Infinity are not JSON numbers") from None
    except TypeError as error:
        raise InvalidEvent(f"value: not a JSON value ({error})") from None
    return utf8(text)


def kind_of(document: Any) -> str:
    names = {dict: "an object", list: "an array", bool: "a boolean", type(None): "null"}
    return names.get(type(document), "a string" if isinstance(document, str) else "a number")


def to_json(value: Any) -> bytes:
    """A step's value as JSON: pydantic models by their fields, named tuples as arrays."""
    return orjson.dumps(value, default=_default)


def _default(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    raise TypeError(f"{type(value).__name__} is not a JSON value")


@dataclass(frozen=True)
class TextType:
    """UTF-8 text; the produce endpoint takes a JSON string."""

    name: str = "text"

    def parse(self, raw: bytes | None, max_bytes: int = DEFAULT_MAX_BYTES) -> str:
        return decode_utf8(check_size(raw, max_bytes))

    def parse_many(self, raws: Sequence[bytes | None], max_bytes: int) -> list[Any]:
        """:meth:`parse` of each value in one pass when every one is valid (the usual
        batch); else value by value."""
        if None not in raws and (not raws or max(map(len, raws)) <= max_bytes):  # type: ignore[arg-type]
            try:
                return list(map(bytes.decode, raws))  # type: ignore[arg-type]
            except UnicodeDecodeError:
                pass
        return parse_each(self.parse, raws, max_bytes)

    def encode(self, value: Any) -> bytes:
        return utf8(value) if isinstance(value, str) else bytes(value)

    def from_json(self, document: Any) -> bytes:
        if not isinstance(document, str):
            raise InvalidEvent(
                f"value: a {self.name} value is a JSON string, not {kind_of(document)}"
            )
        return utf8(document)


@dataclass(frozen=True)
class JsonType:
    """Any JSON value (strict: no NaN)."""

    name: str = "json"

    def parse(self, raw: bytes | None, max_bytes: int = DEFAULT_MAX_BYTES) -> Any:
        raw = check_size(raw, max_bytes)
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError as error:
            decode_utf8(raw)
            raise InvalidEvent(f"value: not JSON ({error.msg} at byte {error.pos})") from None

    def encode(self, value: Any) -> bytes:
        return to_json(value)

    def from_json(self, document: Any) -> bytes:
        return json_bytes(document)


@dataclass(frozen=True)
class BytesType:
    """The raw bytes, unchecked but for the size; the produce endpoint takes a JSON string
    (written as UTF-8) or any other JSON value (written as JSON)."""

    name: str = "bytes"

    def parse(self, raw: bytes | None, max_bytes: int = DEFAULT_MAX_BYTES) -> bytes:
        return check_size(raw, max_bytes)

    def parse_many(self, raws: Sequence[bytes | None], max_bytes: int) -> list[Any]:
        if None not in raws and (not raws or max(map(len, raws)) <= max_bytes):  # type: ignore[arg-type]
            return list(raws)
        return parse_each(self.parse, raws, max_bytes)

    def encode(self, value: Any) -> bytes:
        return utf8(value) if isinstance(value, str) else bytes(value)

    def from_json(self, document: Any) -> bytes:
        return utf8(document) if isinstance(document, str) else json_bytes(document)


Text = TextType()
Json = JsonType()
Bytes = BytesType()


def describe(error: ValidationError) -> str:
    """A pydantic error as one line naming each field."""
    parts = []
    for item in error.errors(include_url=False):
        where = ".".join(str(p) for p in item["loc"]) or "value"
        parts.append(f"{where}: {item['msg']}")
    return "; ".join(parts)


def parse_model(model: type[M], raw: bytes | None, max_bytes: int = DEFAULT_MAX_BYTES) -> M:
    """Validate one JSON record value against a pydantic model, or raise InvalidEvent."""
    raw = check_size(raw, max_bytes)
    decode_utf8(raw)
    try:
        return model.model_validate_json(raw)
    except ValidationError as error:
        raise InvalidEvent(describe(error)) from None


def unreadable(error: Exception) -> InvalidEvent:
    """A value a reader failed on, refused with what it raised."""
    return InvalidEvent(f"value: cannot be read: {type(error).__name__}: {error}"[:500])


def batch_reader_failed(name: str, records: int, error: Exception) -> None:
    """Log that the batch reader of value type ``name`` raised: as a warning the first
    time, then at debug level (a reader that fails on every batch would flood the log)."""
    first = name not in _BATCH_READERS_FAILED
    _BATCH_READERS_FAILED.add(name)
    logger.log(
        logging.WARNING if first else logging.DEBUG,
        "%s: the batch reader raised on %d records (%s: %s); each record is read alone%s",
        name,
        records,
        type(error).__name__,
        error,
        "; later failures are logged at debug level" if first else "",
    )


def read_each(
    read: Callable[[bytes | None, int], Any], raws: Sequence[bytes | None], max_bytes: int
) -> list[Any]:
    """A reader's value of each record (see :class:`Model`), an :class:`InvalidEvent` in
    the place of each it refuses or fails on: what it raises is its verdict."""
    found: list[Any] = []
    append = found.append
    for raw in raws:
        try:
            append(read(raw, max_bytes))
        except InvalidEvent as error:
            append(error)
        except Exception as error:
            append(unreadable(error))
    return found


@dataclass(frozen=True)
class Model(Generic[T]):
    """JSON validated by a pydantic model.

    ``parse`` may be given as a faster reader with the same verdicts (and the same
    reasons) as the model's validation; its values are what the steps receive.
    ``encode`` writes such a value back as record bytes (default: the model's JSON).
    ``many`` may read a whole batch at once: what ``reader`` gives for each value, an
    :class:`InvalidEvent` in the place of each it refuses.
    """

    model: type[BaseModel]
    reader: Callable[[bytes | None, int], T] | None = None
    writer: Callable[[Any], bytes] | None = None
    name: str = field(default="")
    many: Callable[[Sequence[bytes | None], int], list[Any]] | None = None

    def __post_init__(self) -> None:
        if not self.name:
            object.__setattr__(self, "name", self.model.__name__)

    def parse(self, raw: bytes | None, max_bytes: int = DEFAULT_MAX_BYTES) -> T:
        if self.reader is not None:
            try:
                return self.reader(raw, max_bytes)
            except InvalidEvent:
                raise
            except Exception as error:  # the reader's verdict: it cannot read the value
                raise unreadable(error) from None
        parsed: Any = parse_model(self.model, raw, max_bytes)
        return parsed  # type: ignore[no-any-return]

    def parse_many(self, raws: Sequence[bytes | None], max_bytes: int) -> list[Any]:
        """:meth:`parse` of each value, an :class:`InvalidEvent` in the place of each it
        refuses (one loop for the batch: no call per value beyond the reader's)."""
        if self.many is not None:
            try:
                batch = self.many(raws, max_bytes)
            except Exception as error:  # each value is then judged by the reader, one at a time
                batch_reader_failed(self.name, len(raws), error)
                batch = None
            if batch is not None:
                if len(batch) != len(raws):
                    raise ValueError(
                        f"{self.name}: its batch reader gave {len(batch)} values for "
                        f"{len(raws)} records"
                    )
                return batch
        if self.reader is None:
            return parse_each(self.parse, raws, max_bytes)
        return read_each(self.reader, raws, max_bytes)

    def encode(self, value: Any) -> bytes:
        if self.writer is not None:
            return self.writer(value)
        if isinstance(value, BaseModel):
            return value.model_dump_json().encode()
        return to_json(value)

    def from_json(self, document: Any) -> bytes:
        return json_bytes(document)


@dataclass(frozen=True)
class Typed(Generic[T]):
    """JSON validated as a Python type by pydantic, strictly: ``Typed(StrictInt)``."""

    type: Any
    name: str = "json"

    def _adapter(self) -> TypeAdapter[Any]:
        return _adapter(self.type)

    def parse(self, raw: bytes | None, max_bytes: int = DEFAULT_MAX_BYTES) -> T:
        raw = check_size(raw, max_bytes)
        decode_utf8(raw)
        try:
            found: T = self._adapter().validate_json(raw, strict=True)
        except ValidationError as error:
            raise InvalidEvent(describe(error)) from None
        return found

    def encode(self, value: Any) -> bytes:
        return self._adapter().dump_json(value)

    def from_json(self, document: Any) -> bytes:
        return json_bytes(document)


@functools.lru_cache(maxsize=64)
def _adapter(kind: Any) -> TypeAdapter[Any]:
    return TypeAdapter(kind)


#: The latest event time a record may carry (ms): the end of year 9999, as the query
#: routes' times.
MAX_EVENT_TIME_MS = 253_402_300_799_999

_MISSING: Any = object()


def required_field(value: Any, name: str) -> Any:
    """A named field of a value (an attribute, or a key of a JSON object), or
    InvalidEvent when the value has no such field."""
    is_object = isinstance(value, dict)
    found = value.get(name, _MISSING) if is_object else getattr(value, name, _MISSING)
    if found is _MISSING:
        raise InvalidEvent(f"{name}: Field required")
    return found


def event_time(value: Any, name: str) -> int:
    """A record's event time from its field ``name``: whole milliseconds since the epoch,
    from 0 to :data:`MAX_EVENT_TIME_MS`, else InvalidEvent saying what is wrong."""
    found = required_field(value, name)
    kind = type(found)
    shown = repr(found)[:40]
    if not (kind is int or (kind is float and found.is_integer())):
        raise InvalidEvent(f"{name}: the event time must be whole milliseconds, not {shown}")
    if not 0 <= found <= MAX_EVENT_TIME_MS:
        raise InvalidEvent(
            f"{name}: the event time {shown} ms is out of range (0 to {MAX_EVENT_TIME_MS})"
        )
    return int(found)


def check_key(key: bytes | None, expected: str, field_name: str) -> None:
    """A keyed topic's record key must equal the field it is partitioned by."""
    if key is None:
        raise InvalidEvent(f"key: missing, expected the {field_name} {expected!r}")
    if key != expected.encode("utf-8"):
        shown = key.decode("utf-8", "replace")[:80]
        raise InvalidEvent(f"key: {shown!r} does not match {field_name} {expected!r}")
