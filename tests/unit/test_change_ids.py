"""The ids of change-stream events: a stream resumed with ``Last-Event-ID`` skips the
current value only when it is the very value (of the very window) the client saw."""

from __future__ import annotations

from api.changes import Change, change_frame, event_id
from api.positions import ReadPosition
from tables.windows import Tumbling, table_key

MINUTE = 60_000
WINDOW = Tumbling(MINUTE)


def test_the_same_value_in_another_window_is_another_event() -> None:
    first = table_key(WINDOW, "wk", 1_700_000_040_000)
    later = table_key(WINDOW, "wk", 1_700_000_100_000)
    assert event_id(b"1", first) != event_id(b"1", later)
    assert event_id(b"1", first) == event_id(b"1", first)
    assert event_id(b"1") != event_id(b"2")
    assert event_id(None, first) == event_id(None) == "absent"


def test_a_frame_carries_the_id_a_resumed_stream_compares() -> None:
    key = table_key(WINDOW, "wk", 1_700_000_040_000)
    position = ReadPosition(0, {}, 0, 0)
    frame = change_frame(Change(b"3", None, key), position, window=WINDOW)
    assert frame.startswith(f"id: {event_id(b'3', key)}\nevent: change\n".encode())
