"""Corrections: the nightly job's repairs, applied by the worker that owns each key.

A record on ``corrections`` sets one key of a queryable table to the batch job's value,
or deletes it when the value is null::

    {"table": "visits", "key": "alice", "value": 12, "expected": 11}
    {"table": "views", "key": "alice", "window": {"start": 1700000000000, "end": ...}, ...}

It is keyed by the key the table is partitioned by (for a windowed table the grouped
key, not the window), so it sits in the partition of ``corrections`` that matches the
key's table partition. A windowed table's window is named by ``window`` (or, as earlier
versions wrote it, by ``<key>@<window start ms>`` as the key).

``expected`` is the live value the job saw at its cut (null: the key was absent): the
correction is applied only if the table still holds exactly that value; a key that
changed since keeps its newer value and the correction goes to ``corrections-dlq``, and
the next run looks at the key again. Invalid corrections go there too, with the reason.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from typing import Annotated, Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError

from core.topics import CORRECTIONS, dlq_topic
from core.values import InvalidEvent, describe, parse_model
from tables.pipeline import Batch, Pipeline, TableSpec
from tables.windows import AnyWindow, Session, table_key

logger = logging.getLogger(__name__)

#: Separator of a window key in a correction of earlier versions: ``<key>@<start ms>``.
WINDOW_KEY_SEP = "@"


class WindowSpan(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    start: Annotated[StrictInt, Field(ge=0)]
    end: Annotated[StrictInt, Field(ge=0)]


class Correction(BaseModel):
    """A repair on ``corrections``: the batch value of one table key."""

    model_config = ConfigDict(extra="ignore", strict=True)

    table: Annotated[str, Field(min_length=1, max_length=256)]
    key: Annotated[str, Field(min_length=1, max_length=4096)]
    value: Any = None
    window: WindowSpan | None = None


def correction_record(
    table: str,
    key: str,
    value: Any,
    *,
    expected: Any = None,
    has_expected: bool = True,
    window: tuple[int, int] | None = None,
) -> tuple[bytes, bytes]:
    """The (key, value) of the ``corrections`` record that sets ``table``'s ``key``
    (in ``window``: start and end ms) to ``value``."""
    document: dict[str, Any] = {"table": table, "key": key, "value": value}
    if has_expected:
        document["expected"] = expected
    if window is not None:
        document["window"] = {"start": window[0], "end": window[1]}
    return key.encode("utf-8"), orjson.dumps(document)


def _table_key(spec: TableSpec, correction: Correction) -> tuple[str, bytes]:
    """(the key the table is partitioned by, the table's key bytes) of a correction."""
    window: AnyWindow | None = spec.window
    if window is None:
        if correction.window is not None:
            raise InvalidEvent(f"window: {spec.name} is not windowed")
        return correction.key, correction.key.encode("utf-8")
    span = correction.window
    key = correction.key
    if span is None:
        key, sep, start = correction.key.rpartition(WINDOW_KEY_SEP)
        if not sep or not key or not start.isdigit():
            raise InvalidEvent(
                f"key: {correction.key[:80]!r} names no window: give window "
                "{start, end} or a key <key>@<window start ms>"
            )
        span = WindowSpan(start=int(start), end=window.end(int(start)))
    if not isinstance(window, Session) and span.start not in window.starts(span.start):
        raise InvalidEvent(
            f"window.start: {span.start} is not the start of a window of {spec.name}"
        )
    return key, table_key(window, key, span.start, span.end - 1)


def plan(
    tables: Mapping[str, TableSpec], raw_key: bytes | None, raw_value: bytes | None
) -> tuple[str, bytes, Any, bool, Any]:
    """Check one ``corrections`` record: (table, table key bytes, value, whether it has
    an expected value, the expected value)."""
    correction = parse_model(Correction, raw_value, 1 << 24)
    spec = tables.get(correction.table)
    if spec is None:
        raise InvalidEvent(f"table: {correction.table[:80]!r} cannot be corrected")
    partition_key, key = _table_key(spec, correction)
    if raw_key != partition_key.encode("utf-8"):
        shown = (raw_key or b"").decode("utf-8", "replace")[:80]
        raise InvalidEvent(f"key: {shown!r} is not the table's key {partition_key[:80]!r}")
    value = correction.value
    if value is not None and spec.value_type is not None:
        try:
            value = orjson.loads(spec.value_type.encode(spec.value_type.parse(orjson.dumps(value))))
        except InvalidEvent as error:
            raise InvalidEvent(f"value: {error.reason}") from None
        except ValidationError as error:
            raise InvalidEvent(describe(error)) from None
    document = orjson.loads(raw_value or b"{}")
    return spec.name, key, value, "expected" in document, document.get("expected")


def apply_corrections(batch: Batch, *, tables: Mapping[str, TableSpec]) -> None:
    """Set (or delete) each corrected key, unless it changed since the job's cut."""
    for record in batch.of(CORRECTIONS):
        try:
            name, key, value, has_expected, expected = plan(tables, record.key, record.value)
        except InvalidEvent as error:
            batch.dead_letter(record, error.reason)
            continue
        table = batch.table(name)
        if has_expected and table.get(key) != expected:
            shown = key.decode("utf-8", "replace")
            batch.dead_letter(record, f"stale: {name} {shown!r} changed since the batch cut")
            continue
        if value is None:
            table.delete(key)
        else:
            table.put(key, value)
        logger.info("correction applied to %s %r", name, key)


def corrections_pipeline(tables: Mapping[str, TableSpec]) -> Pipeline | None:
    """The pipeline that applies corrections to every queryable table (None: no table
    is queryable)."""
    correctable = {name: spec for name, spec in tables.items() if spec.queryable}
    if not correctable:
        return None
    return Pipeline(
        name="corrections.apply",
        reads=(CORRECTIONS,),
        writes=tuple(correctable.values()),
        produces=(dlq_topic(CORRECTIONS),),
        process=functools.partial(apply_corrections, tables=correctable),
    )
