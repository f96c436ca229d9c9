"""A windowed stream-stream join of two co-partitioned topics, buffered in RocksDB tables.

faust has no joins, so this is one in the manner of Kafka Streams' KStream-KStream left
join: a left record ``l`` and a right record ``r`` with equal join keys match when
``r.ts`` lies in ``[l.ts - before, l.ts + after]``. Every matching pair is emitted once;
a left record that matched nothing is emitted on its own (the left join) once event time
on *both* inputs' partitions has passed its window, right event time by its grace too.

Event time is kept per input partition: the largest ``ts`` seen on that side. The result
must not depend on how the consumption of the two topics interleaves, so whether a pair
matches may depend only on what each topic partition delivered before each record, never
on the other side's progress at the moment the two meet. Each buffered record remembers
its own side's event time when it arrived (its *watermark*), and a pair matches only when
neither record arrived after its own side had passed the other's window by more than that
side's grace:

* ``r`` is too late for ``l`` when ``r.watermark - right_grace > l.ts + after``;
* ``l`` is too late for ``r`` when ``l.watermark - left_grace > r.ts + before``.

Records are kept exactly as long as a partner that could still match may arrive: a left
record until right event time has passed ``l.ts + after + right_grace`` (and left event
time ``l.ts + after``), a right record until left event time has passed
``r.ts + before + left_grace``. So whichever record of a matching pair comes second finds
the first still buffered, in any interleaving, and an unmatched left record is final when
it leaves. Buffered records and both watermarks live in changelogged RocksDB tables of the
event's partition; expired records are deleted, with tombstones, as event time moves.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

Side = Literal["left", "right"]
LEFT: Side = "left"
RIGHT: Side = "right"

_RECORD = b"k"  # k <len:2> <join key> <seq>: the buffered record
_BY_TIME = b"t"  # t <ts:8> <seq>: the record's key, for expiry in event-time order
_SEQ = struct.Struct(">IQ")  # source partition, source offset: unique, stable on replay
_TS = struct.Struct(">Q")


@dataclass(frozen=True)
class JoinWindow:
    """Right records match left records with ``r.ts`` in ``[l.ts - before, l.ts + after]``.

    A side's grace is how far behind that side's event time one of its records may arrive
    and still meet every partner; the other side's records are kept that much longer.
    """

    before_ms: int
    after_ms: int
    left_grace_ms: int = 0
    right_grace_ms: int = 0

    def __post_init__(self) -> None:
        bounds = (self.before_ms, self.after_ms, self.left_grace_ms, self.right_grace_ms)
        if min(bounds) < 0:
            raise ValueError(f"window bounds and graces must not be negative: {self}")

    def contains(self, left_ts: int, right_ts: int) -> bool:
        """Whether a right record at ``right_ts`` lies in the window of a left one."""
        return left_ts - self.before_ms <= right_ts <= left_ts + self.after_ms

    def left_passed(self, left_ts: int, left_time: int | None) -> bool:
        """Whether left event time has passed the window of a left record."""
        return left_time is not None and left_time > left_ts + self.after_ms

    def left_closed(self, left_ts: int, right_time: int | None) -> bool:
        """Whether right event time rules out any further partner of a left record."""
        return right_time is not None and right_time - self.right_grace_ms > left_ts + self.after_ms

    def right_closed(self, right_ts: int, left_time: int | None) -> bool:
        """Whether left event time rules out any further partner of a right record."""
        return left_time is not None and left_time - self.left_grace_ms > right_ts + self.before_ms

    def matches(self, left: Buffered, right: Buffered) -> bool:
        """Whether two records with equal join keys form a pair, in any interleaving."""
        return (
            self.contains(left.ts, right.ts)
            and not self.left_closed(left.ts, right.watermark)
            and not self.right_closed(right.ts, left.watermark)
        )


@dataclass(frozen=True)
class Buffered:
    """One record of one side, as the join keeps it."""

    join_key: bytes
    ts: int
    #: Its side's event time right after it arrived (its own ts included).
    watermark: int
    #: Partition and offset of the source record: its identity in the buffer.
    seq: bytes
    value: Any
    matched: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "join_key": self.join_key.hex(),
            "ts": self.ts,
            "watermark": self.watermark,
            "seq": self.seq.hex(),
            "value": self.value,
            "matched": self.matched,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Buffered:
        return cls(
            join_key=bytes.fromhex(data["join_key"]),
            ts=int(data["ts"]),
            watermark=int(data["watermark"]),
            seq=bytes.fromhex(data["seq"]),
            value=data["value"],
            matched=bool(data["matched"]),
        )


@dataclass
class JoinResult:
    """What one input record produced: matched pairs and expired unmatched left records."""

    pairs: list[tuple[Any, Any]] = field(default_factory=list)
    unmatched: list[Any] = field(default_factory=list)


class PartitionStore(Protocol):
    """One partition of a key-value store with JSON values and ordered keys."""

    def get(self, key: bytes) -> Any | None: ...

    def put(self, key: bytes, value: Any) -> None: ...

    def insert(self, key: bytes, value: Any) -> None:
        """Put a key known to be new."""
        ...

    def delete(self, key: bytes) -> None: ...

    def scan(self, prefix: bytes) -> Iterator[tuple[bytes, Any]]:
        """Items whose key starts with ``prefix``, in key order."""
        ...


def sequence(partition: int, offset: int) -> bytes:
    """The identity of a source record in the buffers."""
    return _SEQ.pack(partition, offset)


def record_key(join_key: bytes, seq: bytes) -> bytes:
    return _RECORD + len(join_key).to_bytes(2, "big") + join_key + seq


def _join_prefix(join_key: bytes) -> bytes:
    return _RECORD + len(join_key).to_bytes(2, "big") + join_key


def time_key(ts: int, seq: bytes) -> bytes:
    return _BY_TIME + _TS.pack(ts) + seq


def _time_of(key: bytes) -> int:
    return int(_TS.unpack_from(key, len(_BY_TIME))[0])


class PartitionJoin:
    """The join state machine of one partition over three stores: left, right, watermarks."""

    def __init__(
        self,
        window: JoinWindow,
        left: PartitionStore,
        right: PartitionStore,
        watermarks: PartitionStore,
        partition: int,
    ) -> None:
        self.window = window
        self.stores = {LEFT: left, RIGHT: right}
        self.watermarks = watermarks
        self.partition = partition

    def watermark(self, side: Side) -> int | None:
        """Event time of one side on this partition: the largest ts seen, or None."""
        value = self.watermarks.get(self._watermark_key(side))
        return None if value is None else int(value)

    def process(
        self, side: Side, ts: int, offset: int, join_key: bytes | None, value: Any = None
    ) -> JoinResult:
        """Apply one record of ``side``; a record without a join key only moves event time.

        Records whose windows have closed stay buffered until :meth:`expire`, which a
        batch calls once after its records: whether two records match depends only on
        their own watermarks, so a record that could have been expired earlier never
        matches a later one anyway, and the results are those of expiring after every
        record.
        """
        result = JoinResult()
        self._advance(side, ts)
        marks = self._marks()
        if join_key is not None:
            seq = sequence(self.partition, offset)
            watermark = marks[side]
            assert watermark is not None  # _advance has just set it
            record = Buffered(join_key, ts, watermark, seq, value)
            self._admit(side, self._match(side, record, result), marks, result)
        return result

    def expire(self) -> list[Any]:
        """Drop every record no partner can still match; return the left records among
        them that matched nothing."""
        result = JoinResult()
        self._expire(self._marks(), result)
        return result.unmatched

    def buffered(self, side: Side) -> int:
        """How many records of ``side`` this partition holds."""
        return sum(1 for _ in self.stores[side].scan(_RECORD))

    def _watermark_key(self, side: Side) -> bytes:
        return f"{side}:{self.partition}".encode()

    def _advance(self, side: Side, ts: int) -> None:
        current = self.watermark(side)
        if current is None or current < ts:
            self.watermarks.put(self._watermark_key(side), ts)

    def _marks(self) -> dict[Side, int | None]:
        return {LEFT: self.watermark(LEFT), RIGHT: self.watermark(RIGHT)}

    def _match(self, side: Side, record: Buffered, result: JoinResult) -> Buffered:
        other_side: Side = RIGHT if side == LEFT else LEFT
        other = self.stores[other_side]
        for key, data in list(other.scan(_join_prefix(record.join_key))):
            partner = Buffered.from_json(data)
            left, right = (record, partner) if side == LEFT else (partner, record)
            if not self.window.matches(left, right):
                continue
            result.pairs.append((left.value, right.value))
            if side == LEFT:
                record = _with_match(record)
            elif not partner.matched:
                other.put(key, _with_match(partner).to_json())
        return record

    def _admit(
        self, side: Side, record: Buffered, marks: dict[Side, int | None], result: JoinResult
    ) -> None:
        if self._expired(side, record.ts, marks):
            # Already past its window on both sides: never stored, so no changelog churn.
            if side == LEFT and not record.matched:
                result.unmatched.append(record.value)
            return
        store = self.stores[side]
        key = record_key(record.join_key, record.seq)
        if store.get(key) is not None:
            return  # applied before (the record was fetched again)
        store.insert(key, record.to_json())
        store.insert(time_key(record.ts, record.seq), key.hex())

    def _expired(self, side: Side, ts: int, marks: dict[Side, int | None]) -> bool:
        """Whether no partner can still match a record of ``side`` at ``ts``, and (for a
        left record) event time on both sides has passed its window."""
        if side == RIGHT:
            return self.window.right_closed(ts, marks[LEFT])
        return self.window.left_closed(ts, marks[RIGHT]) and self.window.left_passed(
            ts, marks[LEFT]
        )

    def _expire(self, marks: dict[Side, int | None], result: JoinResult) -> None:
        for side in (LEFT, RIGHT):
            store = self.stores[side]
            done: list[tuple[bytes, bytes]] = []
            for index_key, record_hex in store.scan(_BY_TIME):
                if not self._expired(side, _time_of(index_key), marks):
                    break
                done.append((index_key, bytes.fromhex(record_hex)))
            for index_key, key in done:
                data = store.get(key)
                if side == LEFT and data is not None and not data["matched"]:
                    result.unmatched.append(data["value"])
                store.delete(key)
                store.delete(index_key)


def _with_match(record: Buffered) -> Buffered:
    return Buffered(
        record.join_key, record.ts, record.watermark, record.seq, record.value, matched=True
    )
