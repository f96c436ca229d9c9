"""The records a repair publishes to ``corrections``, one per differing key.

A record is keyed by the key the table is partitioned by, as UTF-8 (for a windowed table
the grouped key, not the window key), so it lands in the partition of ``corrections``
whose worker owns that key. Its value::

    {"table": name, "key": key, "value": <the batch value, null: delete>,
     "expected": <the live value at the cut, null: absent>,
     "window": {"start": ms, "end": ms}}      # windowed tables only

A worker applies it only while the table still holds ``expected`` (a key that changed
since the cut keeps its newer value). Pure: both the job and tests build records here.
"""

from __future__ import annotations

from typing import Any

import orjson

#: The topic the workers apply corrections from.
CORRECTIONS_TOPIC = "corrections"

Window = tuple[int, int]


def correction_record(
    table: str,
    key: str,
    value: Any,
    expected: Any,
    window: Window | None = None,
    *,
    has_expected: bool = True,
) -> tuple[bytes, bytes]:
    """(record key, record value) of the correction that sets ``table``'s ``key`` (in
    ``window``: start and end ms, the end exclusive) from ``expected`` to ``value``.
    ``has_expected`` False leaves ``expected`` out: the live value could not be read, and
    is replaced whatever it is."""
    document: dict[str, Any] = {"table": table, "key": key, "value": value}
    if has_expected:
        document["expected"] = expected
    if window is not None:
        document["window"] = {"start": window[0], "end": window[1]}
    return key.encode("utf-8"), orjson.dumps(document)


def corrections_for(
    table: str,
    key: str,
    batch: Any,
    live: Any,
    batch_window: Window | None,
    live_window: Window | None,
    *,
    live_readable: bool = True,
) -> list[tuple[bytes, bytes]]:
    """The corrections that make the live table hold the batch's value for one key:
    one record, or two when the key's window itself differs (a session that ends
    elsewhere: the live window is deleted, the batch's written). ``batch``/``live``:
    the values (None: absent on that side)."""
    if batch_window is not None and live_window is not None and batch_window != live_window:
        return [
            correction_record(table, key, None, live, live_window, has_expected=live_readable),
            correction_record(table, key, batch, None, batch_window),
        ]
    window = batch_window if batch_window is not None else live_window
    return [correction_record(table, key, batch, live, window, has_expected=live_readable)]
