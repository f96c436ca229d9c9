"""Change streams: ``GET /tables/{table}/keys/{key}/changes`` as server-sent events.

The active owner of the key's partition answers: first the key's current value (``event:
change``, or ``event: absent``), then one ``event: change`` per value the table takes,
in order, each with the position of the copy that holds it. The engine hands every
cycle's writes to :class:`ChangeHub` right after they reach the store, so a stream sees
exactly the values the table held; a cycle that updated a key several times holds only
its last value. Each event's ``id`` names the value it carries: a client that reconnects
with ``Last-Event-ID`` gets the current value first only if it differs from the one it
last saw. A worker that is not the owner relays the owner's stream. On a rebalance every
stream ends with ``event: moved``; the client reconnects and is routed to the new owner.
Comment lines keep idle streams alive.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from api.errors import NoReplica, NotHeldHere
from api.local import LocalCopy
from api.peers import StreamNotOpened
from api.positions import Positions, ReadPosition
from api.queries import KeyQuery, Queries
from tables.windows import AnyWindow, key_prefix, parse_window_range, window_end_ms

#: Seconds between keep-alive comments on an idle stream.
HEARTBEAT_S = 15.0
#: Changes a slow client may fall behind by; beyond it the oldest are dropped (the
#: latest value is always delivered).
QUEUE_SIZE = 4096


def event_id(raw: bytes | None, window_key: bytes | None = None) -> str:
    """The id of an event carrying the value ``raw`` (None: absent), of the window
    ``window_key`` for a windowed table: a stream resumed with it skips the current
    value only when that is the same value of the same window."""
    if raw is None:
        return "absent"
    hashed = raw if window_key is None else window_key + b"\x00" + raw
    digest = hashlib.blake2b(hashed, digest_size=12).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def frame(event: str, data: Mapping[str, Any], ident: str | None = None) -> bytes:
    """One server-sent event."""
    head = f"id: {ident}\n" if ident is not None else ""
    return f"{head}event: {event}\n".encode() + b"data: " + orjson.dumps(data) + b"\n\n"


HEARTBEAT = b": keep-alive\n\n"


@dataclass
class Change:
    """A value a key took (None: deleted), with the raw position of the copy."""

    raw: bytes | None
    position: bytes | None
    window_key: bytes | None = None


@dataclass(eq=False)
class Subscription:
    """One open stream's queue of changes."""

    table: str
    key: bytes
    windowed: bool
    changes: deque[Change] = field(default_factory=lambda: deque(maxlen=QUEUE_SIZE))
    moved: bool = False
    _ready: asyncio.Event = field(default_factory=asyncio.Event)

    def push(self, change: Change) -> None:
        self.changes.append(change)
        self._ready.set()

    def close(self) -> None:
        self.moved = True
        self._ready.set()

    async def next(self, seconds: float) -> Change | None:
        """The next change, or None after ``seconds`` or once moved."""
        if not self.changes and not self.moved:
            self._ready.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._ready.wait(), seconds)
        return self.changes.popleft() if self.changes else None


class ChangeHub:
    """The subscriptions of this worker's open streams, fed after each engine cycle."""

    def __init__(self) -> None:
        #: table -> key (the raw key; the window key prefix for windowed tables) -> streams
        self._keys: dict[str, dict[bytes, set[Subscription]]] = {}
        self.opened = 0

    @property
    def open(self) -> int:
        return sum(len(s) for keys in self._keys.values() for s in keys.values())

    def subscribe(self, table: str, key: str, *, windowed: bool) -> Subscription:
        raw = key_prefix(key) if windowed else key.encode("utf-8")
        sub = Subscription(table, raw, windowed)
        self._keys.setdefault(table, {}).setdefault(raw, set()).add(sub)
        self.opened += 1
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        keys = self._keys.get(sub.table, {})
        subs = keys.get(sub.key)
        if subs is not None:
            subs.discard(sub)
            if not subs:
                del keys[sub.key]

    def subscribed(self, table: str) -> Mapping[bytes, set[Subscription]]:
        """The raw keys of ``table`` some stream follows, with their streams."""
        return self._keys.get(table, {})

    def moved(self) -> None:
        """A rebalance: every stream ends with ``event: moved``."""
        for keys in self._keys.values():
            for subs in keys.values():
                for sub in subs:
                    sub.close()
        self._keys.clear()

    def on_cycle(
        self,
        table: str,
        partition: int,
        changes: Mapping[bytes, bytes | None],
        position: bytes | None,
    ) -> None:
        """The engine's listener: hand each subscribed key's new value to its streams."""
        keys = self._keys.get(table)
        if not keys:
            return
        for key, subs in keys.items():
            if not subs:
                continue
            windowed = next(iter(subs)).windowed
            if windowed:
                for changed, raw in changes.items():
                    if changed.startswith(key):
                        for sub in subs:
                            sub.push(Change(raw, position, changed))
            elif key in changes:
                for sub in subs:
                    sub.push(Change(changes[key], position))


def change_frame(change: Change, position: ReadPosition, *, window: AnyWindow | None) -> bytes:
    """The event for one change."""
    data: dict[str, Any] = {"value": None, "position": position.as_dict()}
    if change.window_key is not None:
        parsed = parse_window_range(change.window_key)
        if parsed is not None and window is not None:
            end = window_end_ms(window, parsed[1], parsed[2])
            data["window"] = {"start": parsed[1], "end": end}
    if change.raw is None:
        return frame("absent", data, event_id(None))
    data["value"] = orjson.loads(change.raw)
    return frame("change", data, event_id(change.raw, change.window_key))


async def events(
    sub: Subscription,
    first: bytes | None,
    position_of: Any,
    hub: ChangeHub,
    *,
    window: AnyWindow | None,
) -> AsyncIterator[bytes]:
    """The stream of one subscription, starting with ``first`` (None: nothing to send
    first), ending with ``event: moved``."""
    try:
        if first is not None:
            yield first
        while True:
            change = await sub.next(HEARTBEAT_S)
            if change is not None:
                yield change_frame(change, position_of(change.position), window=window)
            elif sub.moved:
                yield frame("moved", {"detail": "the partition moved: reconnect"})
                return
            else:
                yield HEARTBEAT
    finally:
        hub.unsubscribe(sub)


def global_document(copy: Any, key: str) -> bytes | None:
    """A global table key's current value as a change carries it (None: absent)."""
    document = copy.document(key)
    return None if document is None else orjson.dumps(document)


def global_changes(hub: ChangeHub, table: str, copy: Any) -> Callable[[int, list[bytes]], None]:
    """The listener of a global table's copy that hands the keys a batch of its records
    changed to their streams (looked up only for keys some stream follows)."""

    def changed(partition: int, keys: list[bytes]) -> None:
        followed = hub.subscribed(table)
        if not followed:
            return
        found: dict[bytes, bytes | None] = {}
        for raw in keys:
            if raw in followed:
                found[raw] = global_document(copy, raw.decode("utf-8", "surrogateescape"))
        if found:
            hub.on_cycle(table, partition, found, None)

    return changed


class Changes:
    """Opens change streams: from this worker's active copy, or relayed from the owner."""

    def __init__(self, queries: Queries, hub: ChangeHub) -> None:
        self.queries = queries
        self.hub = hub

    async def open(
        self, query: KeyQuery, forwarded_by: str | None, last_event_id: str | None
    ) -> AsyncIterator[bytes]:
        """The stream of ``query``'s key, or a 421/503 when it cannot be opened here."""
        queries = self.queries
        if query.table.kind == "global":  # every worker holds the whole table
            return self._global(query, last_event_id)
        copy = queries.local.copy(query.table, query.partition)
        if copy is not None and copy.replica == "active":
            return self._local(query, copy, last_event_id)
        routing = queries.routing
        if forwarded_by is not None:
            raise NotHeldHere(
                f"{routing.own_url} is not the active owner of {query.table.name} "
                f"partition {query.partition}"
            )
        owner = routing.owner(query.table, query.partition)
        if owner is None or owner == routing.own_url:
            raise NoReplica(
                f"{query.table.name} partition {query.partition} has no active owner now; "
                "the group may be rebalancing"
            )
        try:
            upstream = await queries.peers.stream(owner, query.path + "/changes", last_event_id)
        except StreamNotOpened as refused:
            raise NoReplica(
                f"the stream of {query.table.name} partition {query.partition} could not be "
                f"relayed: {refused}"
            ) from None
        return self._relay(upstream)

    def _local(
        self, query: KeyQuery, copy: LocalCopy, last_event_id: str | None
    ) -> AsyncIterator[bytes]:
        windowed = query.table.kind == "windowed"
        sub = self.hub.subscribe(query.table.name, query.key, windowed=windowed)
        table, partition = query.table.name, query.partition
        positions: Positions = self.queries.positions

        def position_of(raw: bytes | None) -> ReadPosition:
            return positions.of(table, partition, raw)

        window = query.table.window
        current = Change(None, copy.stored_position())
        if windowed:
            windows = copy.windows(query.key)
            if windows:
                latest = windows[-1]
                current = Change(orjson.dumps(latest.value), current.position, latest.raw_key)
        else:
            current.raw = copy.data.get(query.raw)
        first: bytes | None = None
        if last_event_id is None or last_event_id != event_id(current.raw, current.window_key):
            first = change_frame(current, position_of(current.position), window=window)
        return events(sub, first, position_of, self.hub, window=window)

    def _global(self, query: KeyQuery, last_event_id: str | None) -> AsyncIterator[bytes]:
        """The stream of a global table's key from this worker's own copy, its positions
        those of the copy's partition of the table's topic."""
        copy = query.table.copy
        assert copy is not None, f"{query.table.name} is not a global table"
        sub = self.hub.subscribe(query.table.name, query.key, windowed=False)
        queries, partition = self.queries, query.partition

        def position_of(_raw: bytes | None) -> ReadPosition:
            return queries.global_position(query.table, partition)

        current = Change(global_document(copy, query.key), None)
        first: bytes | None = None
        if last_event_id is None or last_event_id != event_id(current.raw):
            first = change_frame(current, position_of(None), window=None)
        return events(sub, first, position_of, self.hub, window=None)

    async def _relay(self, upstream: Any) -> AsyncIterator[bytes]:
        try:
            async for chunk in upstream.content.iter_any():
                yield chunk
        except Exception:  # the owner went away mid-stream
            pass
        finally:
            upstream.release()
        yield frame("moved", {"detail": "the owner's stream ended: reconnect"})
