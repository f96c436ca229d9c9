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
it leaves.

Storage, in two changelogged tables of the partition:

* the **buffer**, by join key: one value per key holding the buffered records of both
  sides (``{"l": [[ts, watermark, offset, matched, value], ...], "r": [[ts, watermark,
  offset, value], ...]}``), so a record finds its partners with one point lookup, and a
  payment that settles a sale rewrites one value;
* the **index**: both watermarks, and per side the buffered records in event-time order,
  in *chunks*: each batch writes one chunk per side and minute of event time it touched
  (key ``c <side> <minute start> <first offset>``, value ``[[ts, offset, join key], ...]``).
  Expiry walks the chunks of each side in time order and stops at the first minute that
  can still hold a live record, so a batch costs a few index writes, not one per record.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

Side = Literal["left", "right"]
LEFT: Side = "left"
RIGHT: Side = "right"

#: Event time covered by one index chunk.
CHUNK_MS = 60_000
_CHUNK = b"c"
_SIDE_CODE: dict[Side, bytes] = {LEFT: b"l", RIGHT: b"r"}
_CHUNK_KEY = struct.Struct(">QQ")  # minute start, first offset
_MINUTE_KEY = struct.Struct(">Q")  # a chunk key's minute start: a prefix of its chunks
_WATERMARK_KEY: dict[Side, bytes] = {LEFT: b"wl", RIGHT: b"wr"}
#: Fields of a buffered record: [ts, watermark, offset, ...]
_TS, _MARK, _OFFSET = 0, 1, 2
_LEFT_MATCHED, _LEFT_VALUE, _RIGHT_VALUE = 3, 4, 3


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

    def matches(self, left_ts: int, left_mark: int, right_ts: int, right_mark: int) -> bool:
        """Whether two records with equal join keys form a pair, in any interleaving:
        each given by its ts and its side's event time when it arrived."""
        return (
            self.contains(left_ts, right_ts)
            and not self.left_closed(left_ts, right_mark)
            and not self.right_closed(right_ts, left_mark)
        )

    def left_limit(self, left_time: int | None, right_time: int | None) -> int | None:
        """Left records with a ts below this are decided (None: none is yet)."""
        if left_time is None or right_time is None:
            return None
        return min(left_time, right_time - self.right_grace_ms) - self.after_ms

    def right_limit(self, left_time: int | None) -> int | None:
        """Right records with a ts below this can meet no further partner."""
        if left_time is None:
            return None
        return left_time - self.left_grace_ms - self.before_ms


@dataclass
class JoinResult:
    """What a batch produced: matched pairs and unmatched left records that are final."""

    pairs: list[tuple[Any, Any]] = field(default_factory=list)
    unmatched: list[Any] = field(default_factory=list)


class PartitionStore(Protocol):
    """One partition of a key-value store with JSON values (scans: in key order)."""

    def get(self, key: bytes) -> Any | None: ...

    def put(self, key: bytes, value: Any) -> None: ...

    def delete(self, key: bytes) -> None: ...

    def scan(self, prefix: bytes) -> Iterator[tuple[bytes, Any]]:
        """Items whose key starts with ``prefix``, in key order."""
        ...


def chunk_key(side: Side, minute_ms: int, first_offset: int) -> bytes:
    return _CHUNK + _SIDE_CODE[side] + _CHUNK_KEY.pack(minute_ms, first_offset)


def _chunk_minute(key: bytes) -> int:
    return int(_CHUNK_KEY.unpack_from(key, 2)[0])


class PartitionJoin:
    """The join of one partition for one batch: :meth:`process` each record in offset
    order per side, then :meth:`finish` once.

    Values read from the stores are never changed in place: a store may be a view whose
    values belong to a batch that can still be taken back.
    """

    def __init__(self, window: JoinWindow, buffer: PartitionStore, index: PartitionStore) -> None:
        self.window = window
        self.buffer = buffer
        self.index = index
        self.marks: dict[Side, int | None] = {
            LEFT: _int_or_none(index.get(_WATERMARK_KEY[LEFT])),
            RIGHT: _int_or_none(index.get(_WATERMARK_KEY[RIGHT])),
        }
        self._marks_at_start = dict(self.marks)
        self._left_limit: int | None = None
        #: (side, minute) -> the index entries this batch adds, in offset order
        self._chunks: dict[tuple[Side, int], list[list[Any]]] = {}
        #: (side, minute) -> offsets the index holds, read for records fetched again
        self._indexed: dict[tuple[Side, int], set[int]] = {}
        self.result = JoinResult()

    def watermark(self, side: Side) -> int | None:
        """Event time of one side on this partition: the largest ts seen, or None."""
        return self.marks[side]

    def advance(self, side: Side, ts: int) -> None:
        """Move ``side``'s event time to ``ts`` if it is later: what records that meet
        nothing do (a record without a join key, or one a filter took out)."""
        mark = self.marks[side]
        if mark is None or ts > mark:
            self.marks[side] = ts

    def process(
        self, side: Side, ts: int, offset: int, join_key: str | None, value: Any = None
    ) -> None:
        """Apply one record of ``side``; a record without a join key only moves event time.
        (Join keys are text; the buffer stores them UTF-8 encoded.)

        Whether two records match depends only on their own watermarks, so records whose
        windows have closed may stay buffered until :meth:`finish` expires them: a record
        that could have been expired earlier never matches a later one anyway.
        """
        mark = self.marks[side]
        if mark is None or ts > mark:
            mark = self.marks[side] = ts
        if join_key is None:
            return
        if side == LEFT:
            self._left(join_key, ts, mark, offset, value)
        else:
            self._right(join_key, ts, mark, offset, value)

    def finish(self) -> JoinResult:
        """Write the batch's index chunks and watermarks, expire what no partner can
        still match, and return the batch's pairs and final unmatched left records."""
        for (side, minute), entries in self._chunks.items():
            self.index.put(chunk_key(side, minute, entries[0][1]), entries)
        self._chunks, self._indexed = {}, {}
        for side in (LEFT, RIGHT):
            if self.marks[side] != self._marks_at_start[side]:
                self.index.put(_WATERMARK_KEY[side], self.marks[side])
        self._marks_at_start = dict(self.marks)
        self._left_limit = self.window.left_limit(self.marks[LEFT], self.marks[RIGHT])
        self._expire(LEFT, self._left_limit)  # first: see _drop
        self._expire(RIGHT, self.window.right_limit(self.marks[LEFT]))
        result, self.result = self.result, JoinResult()
        return result

    def buffered(self, side: Side) -> int:
        """How many records of ``side`` this partition holds (written by :meth:`finish`)."""
        prefix = _CHUNK + _SIDE_CODE[side]
        return sum(len(entries) for _, entries in self.index.scan(prefix))

    # -- one record ------------------------------------------------------------------

    def _left(self, join_key: str, ts: int, mark: int, offset: int, value: Any) -> None:
        key = join_key.encode()
        found = self.buffer.get(key)
        lefts: list[Any] = []
        matched = False
        if found:
            lefts = found.get("l", [])
            if any(entry[_OFFSET] == offset for entry in lefts):
                self._ensure_indexed(LEFT, ts, offset, join_key)
                return  # applied before: the record was fetched again
            for right in found.get("r", ()):
                if self.window.matches(ts, mark, right[_TS], right[_MARK]):
                    self.result.pairs.append((value, right[_RIGHT_VALUE]))
                    matched = True
        if self.window.left_closed(ts, self.marks[RIGHT]) and self.window.left_passed(
            ts, self.marks[LEFT]
        ):
            # Past its window on both sides already: decided, never stored.
            if not matched:
                self.result.unmatched.append(value)
            return
        entry = [ts, mark, offset, int(matched), value]
        self.buffer.put(key, {**found, "l": [*lefts, entry]} if found else {"l": [entry]})
        self._index(LEFT, ts, offset, join_key)

    def _right(self, join_key: str, ts: int, mark: int, offset: int, value: Any) -> None:
        key = join_key.encode()
        found = self.buffer.get(key)
        rights: list[Any] = found.get("r", []) if found else []
        if any(entry[_OFFSET] == offset for entry in rights):
            self._ensure_indexed(RIGHT, ts, offset, join_key)
            return  # applied before: the record was fetched again
        lefts: list[Any] = found.get("l", []) if found else []
        settled = False
        for i, left in enumerate(lefts):
            if self.window.matches(left[_TS], left[_MARK], ts, mark):
                self.result.pairs.append((left[_LEFT_VALUE], value))
                if not left[_LEFT_MATCHED]:
                    lefts = [*lefts[:i], [*left[:_LEFT_MATCHED], 1, *left[4:]], *lefts[i + 1 :]]
                    settled = True
        if self.window.right_closed(ts, self.marks[LEFT]):
            if settled:  # never stored itself, but it settled a buffered left record
                self.buffer.put(key, {**(found or {}), "l": lefts})
            return
        entry = [ts, mark, offset, value]
        stored: dict[str, Any] = {"r": [*rights, entry]}
        if lefts:
            stored["l"] = lefts
        self.buffer.put(key, stored)
        self._index(RIGHT, ts, offset, join_key)

    def _ensure_indexed(self, side: Side, ts: int, offset: int, join_key: str) -> None:
        """A record fetched again finds its buffer entry; its index entry must be there
        too. Under at_least_once a crash can land the buffer's changelog record without
        the index's: unindexed, the record would never expire, and an unmatched sale would
        never be counted. A minute's chunks are read once per batch, and only for replays."""
        minute = ts - ts % CHUNK_MS
        indexed = self._indexed.get((side, minute))
        if indexed is None:  # read once per batch: a refetched batch replays many records
            prefix = _CHUNK + _SIDE_CODE[side] + _MINUTE_KEY.pack(minute)
            indexed = {entry[1] for _key, entries in self.index.scan(prefix) for entry in entries}
            indexed.update(entry[1] for entry in self._chunks.get((side, minute), ()))
            self._indexed[(side, minute)] = indexed
        if offset not in indexed:
            self._index(side, ts, offset, join_key)

    def _index(self, side: Side, ts: int, offset: int, join_key: str) -> None:
        minute = ts - ts % CHUNK_MS
        entries = self._chunks.get((side, minute))
        if entries is None:
            entries = self._chunks[(side, minute)] = []
        entries.append([ts, offset, join_key])
        indexed = self._indexed.get((side, minute))
        if indexed is not None:
            indexed.add(offset)

    # -- expiry -------------------------------------------------------------------------

    def _expire(self, side: Side, limit: int | None) -> None:
        """Drop the records of ``side`` with a ts below ``limit``; report the left ones
        that matched nothing."""
        if limit is None:
            return
        rewritten: list[tuple[bytes, list[Any]]] = []
        gone: list[bytes] = []
        for key, entries in self.index.scan(_CHUNK + _SIDE_CODE[side]):
            if _chunk_minute(key) >= limit:
                break
            kept = [e for e in entries if e[0] >= limit]
            for ts, offset, join_key in entries:
                if ts < limit:
                    self._drop(side, join_key.encode(), offset)
            if kept:
                if len(kept) < len(entries):
                    rewritten.append((key, kept))
            else:
                gone.append(key)
        for key, kept in rewritten:
            self.index.put(key, kept)
        for key in gone:
            self.index.delete(key)

    def _drop(self, side: Side, join_key: bytes, offset: int) -> None:
        found = self.buffer.get(join_key)
        if not found:
            return
        lefts: list[Any] = found.get("l", [])
        rights: list[Any] = found.get("r", [])
        if side == LEFT:
            for entry in lefts:
                if entry[_OFFSET] == offset and not entry[_LEFT_MATCHED]:
                    self.result.unmatched.append(entry[_LEFT_VALUE])
            if rights:
                # Left as it is: an expired left record can match no later right record,
                # and it goes when the right records do (saving a write per settled sale).
                return
            lefts = [e for e in lefts if e[_OFFSET] != offset]
        else:
            rights = [e for e in rights if e[_OFFSET] != offset]
            if not rights:
                # Every left record below the limit has been expired (and reported) in
                # this batch's left pass already: what is left of them goes now.
                limit = self._left_limit
                lefts = [e for e in lefts if limit is None or e[_TS] >= limit]
        if not lefts and not rights:
            self.buffer.delete(join_key)
            return
        rest: dict[str, Any] = {}
        if lefts:
            rest["l"] = lefts
        if rights:
            rest["r"] = rights
        self.buffer.put(join_key, rest)


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)
