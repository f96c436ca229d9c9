"""A windowed table serves no window past its retention, though the window is still
stored: its partition removes it only at its next write (pure read logic, over an
in-memory partition)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import orjson
from sortedcontainers import SortedDict

from api.local import LocalCopy
from api.routing import QueryTable, window_retention_ms
from tables.windows import Tumbling, table_key

HOUR = 3_600_000
MINUTE = 60_000
WINDOW = Tumbling(MINUTE, retention=HOUR)


class Partition:
    """One partition's raw keys and values, in key order."""

    def __init__(self, items: dict[bytes, Any]) -> None:
        self.items_ = SortedDict({k: orjson.dumps(v) for k, v in items.items()})

    def get(self, key: bytes) -> bytes | None:
        found: bytes | None = self.items_.get(key)
        return found

    def items(self, start: bytes) -> Iterator[tuple[bytes, bytes]]:
        for key in self.items_.irange(minimum=start):
            yield key, self.items_[key]


class Store:
    def held(self, partition: int) -> bool:
        return True


def per_minute() -> QueryTable:
    """A windowed table of one partition whose windows are kept an hour."""
    return QueryTable(
        name="per_minute",
        kind="windowed",
        topic="streamstate-per_minute-changelog",
        partitions=1,
        standby_replicas=0,
        store=Store(),  # type: ignore[arg-type]
        window=WINDOW,
        retention_ms=window_retention_ms(WINDOW, 7.0),
    )


def test_a_window_past_its_retention_is_not_served_by_key_or_scan() -> None:
    now = int(time.time() * 1000)
    recent = now - now % MINUTE
    old = recent - 2 * HOUR
    table = per_minute()
    data = Partition(
        {
            table_key(WINDOW, "ann", old): 5,
            table_key(WINDOW, "ann", recent): 2,
            table_key(WINDOW, "bob", old): 1,
        }
    )
    copy = LocalCopy(table, 0, "active", lambda: 0, data)
    assert [(w.start, w.value) for w in copy.windows("ann")] == [(recent, 2)]
    assert copy.windows("bob") == []
    items, more = copy.scan(b"", None, 10)
    assert (items, more) == (
        [(b"ann", [{"start": recent, "end": recent + MINUTE, "value": 2}])],
        False,
    )


def test_a_window_without_its_own_retention_keeps_the_workers_default() -> None:
    assert window_retention_ms(Tumbling(MINUTE), 7.0) == 7 * 24 * HOUR
    assert window_retention_ms(WINDOW, 7.0) == HOUR
    assert window_retention_ms(None, 7.0) is None


def test_a_read_at_a_time_past_the_retention_says_the_window_is_gone() -> None:
    from types import SimpleNamespace

    from api.queries import KeyQuery, Queries

    now = int(time.time() * 1000)
    recent = now - now % MINUTE
    table = per_minute()
    copy = LocalCopy(
        table, 0, "active", lambda: 0, Partition({table_key(WINDOW, "ann", recent): 2})
    )
    queries = Queries.__new__(Queries)
    queries.routing = SimpleNamespace(own_url="http://w")  # type: ignore[assignment]

    def at(ms: int) -> Any:
        return queries._answer(KeyQuery(table, "ann", b"ann", 0, at=ms), copy)

    assert at(recent + 1).status == 200
    gone = at(recent - 2 * HOUR)
    assert gone.status == 404
    assert gone.body["detail"] == (
        f"key 'ann' not found in per_minute for a window holding {recent - 2 * HOUR} "
        "(the table keeps windows 1 hours: older ones are gone)"
    )
    missing = at(recent - 10 * MINUTE)  # within the retention: no such window
    assert missing.body["detail"].endswith(f"holding {recent - 10 * MINUTE}")
