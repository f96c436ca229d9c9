"""Key reads: answered locally by the active copy, else by the active owner, else by a
standby (this worker's or a peer's). When copies answer but none can serve the read, the
one least behind says why (504: not at the token's position in time; 503: beyond the
staleness bound), with its position; a bare 503 only when no copy answers at all.

A copy that is not the partition's restored active copy (a standby, or an active copy
still restoring) may not have a key yet: it answers the values it holds, with its lag,
but never that a key is absent. Unless the read names a token or a staleness bound (then
the copy has reached the token's position, or is within the bound, and its answer holds
as of its position), only the active copy answers 404 for an absent key; while it cannot
answer, the read gets 503 with ``Retry-After``.

A read that arrives with the forwarding marker is answered from this worker's own copy
or refused with 421, never forwarded again.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from api.errors import BadRequest, NoReplica, NotFound, NotHeldHere, NotYet, QueryError
from api.local import LocalCopy, LocalState, Window
from api.peers import PeerAnswer, Peers, quote_segment
from api.positions import HeldPositions, Positions, PositionWaits, ReadPosition
from api.routing import QueryTable, Routing, query_tables
from api.tokens import Token, TokenError, decode_token
from core.topics import partition_for
from tables.membership import WorkerView

logger = logging.getLogger(__name__)


class OwnerMoved(Exception):
    """A partition changed hands while a standby waited for a read's position."""


#: Longest accepted key, in UTF-8 bytes.
MAX_KEY_BYTES = 1024
#: The pause between two rounds of asking a partition's copies.
PEER_RETRY_SECONDS = 0.3
#: How long a read keeps asking before it answers 503 (seconds; at least its timeout),
#: and a read with a staleness bound, whose refusal is usually final.
READ_PATIENCE_S = 3.0
BOUNDED_PATIENCE_S = 2 * PEER_RETRY_SECONDS


#: How many (token, table partition) consistencies are kept, at most.
TOKENS_KEPT = 4096


@functools.lru_cache(maxsize=4096)
def _decoded_token(text: str, app_id: str, topics: frozenset[str]) -> Token:
    """A token read once: a client that wrote reads several keys with its token."""
    return decode_token(text, app_id, topics=topics)


def key_too_long(key: str) -> bool:
    """Whether a key is over :data:`MAX_KEY_BYTES` bytes of UTF-8 (the limit counts bytes,
    as Kafka's keys are, not characters); encoded only when it could be."""
    return len(key) * 4 > MAX_KEY_BYTES and len(key.encode("utf-8")) > MAX_KEY_BYTES


def key_within_limit(key: str) -> str:
    """A key of a path, at most :data:`MAX_KEY_BYTES` bytes of UTF-8."""
    if key_too_long(key):
        raise ValueError(
            f"{len(key.encode('utf-8'))} bytes of UTF-8; a key is at most {MAX_KEY_BYTES}"
        )
    return key


def encode_key(key: str) -> bytes:
    """The raw UTF-8 bytes of a key, or a 400 naming what is wrong with it."""
    try:
        raw = key.encode("utf-8")
    except UnicodeEncodeError:
        raise BadRequest("key: not valid UTF-8") from None
    if not raw:
        raise BadRequest("key: must not be empty")
    if len(raw) > MAX_KEY_BYTES:
        raise BadRequest(f"key: {len(raw)} bytes exceeds the limit of {MAX_KEY_BYTES}")
    return raw


#: How long a read waits for a token's position by default, and at most (ms).
DEFAULT_WAIT_MS = 5_000
MAX_WAIT_MS = 30_000
#: How long after a token read's timeout a peer asked for it may still answer (network
#: and its event loop), before the read is answered from the other copies.
ANSWER_GRACE_S = 0.3


@dataclass(frozen=True)
class Consistency:
    """What a read asks of the copy that answers it.

    ``wanted``: per partition of the token's source topic that feeds the key's table
    partition, the offset the copy must have reached (read your writes). The lag bounds:
    a copy further behind its inputs does not answer (bounded staleness).
    """

    token: str | None = None
    topic: str | None = None
    wanted: dict[int, int] = field(default_factory=dict)
    timeout_ms: int = DEFAULT_WAIT_MS
    max_lag_records: int | None = None
    max_lag_ms: int | None = None

    @property
    def bounded(self) -> bool:
        return self.max_lag_records is not None or self.max_lag_ms is not None

    @property
    def params(self) -> dict[str, Any]:
        return {
            "consistent_with": self.token,
            "timeout_ms": self.timeout_ms if self.token else None,
            "max_lag_records": self.max_lag_records,
            "max_lag_ms": self.max_lag_ms,
        }

    def beyond(self, position: ReadPosition) -> str | None:
        """Why a copy at ``position`` is beyond the bounds, or None."""
        lag, age = position.lag_records, position.lag_ms
        if self.max_lag_records is not None and (lag is None or lag > self.max_lag_records):
            return f"lag_records {lag} exceeds max_lag_records {self.max_lag_records}"
        if self.max_lag_ms is not None and (age is None or age > self.max_lag_ms):
            return f"lag_ms {age} exceeds max_lag_ms {self.max_lag_ms}"
        return None

    def missing(self, position: ReadPosition) -> dict[str, dict[str, int]]:
        """The token's positions the copy has not reached yet."""
        if self.topic is None:
            return {}
        have = position.applied.get(self.topic, {})
        behind = {str(p): o for p, o in self.wanted.items() if have.get(p, 0) < o}
        return {self.topic: behind} if behind else {}


NO_CONSISTENCY = Consistency()


@dataclass(slots=True)
class ReadOptions:
    """A key read's consistency parameters, as the request gave them."""

    consistent_with: str | None = None
    timeout_ms: int | None = None
    max_lag_records: int | None = None
    max_lag_ms: int | None = None

    def __bool__(self) -> bool:
        return not (
            self.consistent_with is None
            and self.timeout_ms is None
            and self.max_lag_records is None
            and self.max_lag_ms is None
        )


@dataclass(slots=True)
class KeyQuery:
    """A validated key read."""

    table: QueryTable
    key: str
    raw: bytes
    partition: int
    at: int | None = None
    start: int | None = None
    end: int | None = None
    consistency: Consistency = NO_CONSISTENCY

    @property
    def path(self) -> str:
        return f"/tables/{quote_segment(self.table.name)}/keys/{quote_segment(self.key)}"

    @property
    def plain(self) -> bool:
        """No consistency parameter and no window: a read peers answer in batches."""
        c = self.consistency
        return self.table.kind == "table" and c.token is None and not c.bounded

    @property
    def params(self) -> dict[str, Any]:
        return {"at": self.at, "from": self.start, "to": self.end, **self.consistency.params}

    @property
    def wait_s(self) -> float:
        """How long the copy that answers may wait for the read's position."""
        return self.consistency.timeout_ms / 1000 if self.consistency.wanted else 0.0

    def params_within(self, remaining_s: float) -> dict[str, Any]:
        """The query string of a forwarded read: a read that waits for its position
        hands on what is left of its timeout, so the whole read stays within it."""
        params = self.params
        if self.consistency.wanted:
            params["timeout_ms"] = max(0, int(remaining_s * 1000))
        return params


@dataclass(slots=True)
class Answer:
    """A key read's answer: status and JSON body (which names who served it)."""

    status: int
    body: dict[str, Any]

    @property
    def served_by(self) -> str:
        return str(self.body.get("served_by", ""))

    @property
    def replica(self) -> str:
        return str(self.body.get("replica", ""))


def rank(answer: PeerAnswer) -> tuple[int, float, int]:
    """Sort key of usable answers: active first, then least lag, then found before absent."""
    body = answer.body
    lag = body.get("offset_lag")
    return (
        0 if body.get("replica") == "active" else 1,
        float("inf") if lag is None else float(lag),
        0 if answer.status == 200 else 1,
    )


def relayable(answer: PeerAnswer) -> bool:
    """An owner's answer is relayed unless it failed (5xx) or holds no copy (421)."""
    return answer.status < 500 and answer.status != 421 and isinstance(answer.body, dict)


def owners_answer(answer: PeerAnswer | None) -> Answer | None:
    """The owner's answer to relay as the read's: any but a failure, a refusal, and a
    200 or 404 of a copy that is not active (still restoring: maybe behind a standby)."""
    if answer is None or not relayable(answer):
        return None
    if answer.status in (200, 404) and answer.body.get("replica") != "active":
        return None
    return Answer(answer.status, answer.body)


def absent(status: int, body: dict[str, Any]) -> bool:
    """Whether an answer says the key is not there: a 404, or no window in a range."""
    return status == 404 or (status == 200 and body.get("windows") == [])


def trustworthy(answer: PeerAnswer) -> bool:
    """A value from any copy; "absent" only from the active copy.

    A standby or restoring copy may simply not have received the key yet, whatever its
    lag says (it is measured against the changelog end it last fetched): its "absent" is
    no answer.
    """
    return answer.body.get("replica") == "active" or not absent(answer.status, answer.body)


def refused_at(answer: PeerAnswer) -> bool:
    """Whether a copy answered that it cannot serve the read as of a position it gave:
    behind the read's token (504) or its staleness bound, or unsure of an absent key
    (503)."""
    body = answer.body
    return (
        answer.status in (503, 504)
        and isinstance(body, dict)
        and isinstance(body.get("position"), dict)
    )


def behind(answer: PeerAnswer) -> float:
    """How far a refusing copy is behind its inputs (unknown: the furthest)."""
    lag = answer.body["position"].get("lag_records")
    return float("inf") if lag is None else float(lag)


def best_answer(answers: list[PeerAnswer | None]) -> PeerAnswer | None:
    """The best answer of peers asked for their own copy (200 or 404 with a replica)."""
    usable = [
        a
        for a in answers
        if a is not None
        and a.status in (200, 404)
        and isinstance(a.body, dict)
        and a.body.get("replica") in ("active", "standby")
        and trustworthy(a)
    ]
    return min(usable, key=rank) if usable else None


def window_at(windows: list[Window], at: int) -> Window | None:
    """The window holding ``at``; of overlapping (hopping) windows, the latest to start."""
    holding = [w for w in windows if w.start <= at < w.end]
    return max(holding, key=lambda w: w.start) if holding else None


def windows_between(windows: list[Window], start: int, end: int) -> list[Window]:
    """Windows that overlap ``[start, end]``."""
    return [w for w in windows if w.start <= end and w.end > start]


class Queries:
    """Answers key reads for one worker."""

    #: How long a read asks its partition's copies again before it answers 503: longer
    #: than the group takes to hand a dead worker's partitions to the survivors.
    patience_s = READ_PATIENCE_S

    def __init__(
        self,
        worker: WorkerView,
        peers: Peers,
        positions: Positions,
        waits: PositionWaits,
        held: HeldPositions | None = None,
    ) -> None:
        self.worker = worker
        self.routing = Routing(worker.membership)
        self.local = LocalState(worker.membership)
        self.peers = peers
        self.positions = positions
        self.waits = waits
        #: the positions of the active copies, as the engine wrote them
        self.held = held if held is not None else HeldPositions()
        self.app_id = worker.membership.app_id
        self._tables: dict[str, QueryTable] | None = None
        #: what recent tokens ask of the table partitions read with them
        self._consistencies: dict[tuple[Any, ...], Consistency] = {}

    @property
    def tables(self) -> dict[str, QueryTable]:
        if self._tables is None:
            self._tables = query_tables(self.worker)
        return self._tables

    def table(self, name: str) -> QueryTable:
        try:
            return self.tables[name]
        except KeyError:
            raise NotFound(f"unknown table {name!r}") from None

    def consistency(self, table: QueryTable, partition: int, options: ReadOptions) -> Consistency:
        """The consistency a read asks for, or a 400 naming what is wrong with it."""
        token, timeout_ms = options.consistent_with, options.timeout_ms
        max_lag_records, max_lag_ms = options.max_lag_records, options.max_lag_ms
        if token is None:
            if timeout_ms is not None:
                raise BadRequest("timeout_ms applies to reads with consistent_with")
            if max_lag_records is None and max_lag_ms is None:
                return NO_CONSISTENCY
            return Consistency(max_lag_records=max_lag_records, max_lag_ms=max_lag_ms)
        # A client that wrote reads several keys with its token: what a token asks of a
        # table partition is worked out once (the pipelines do not change while they run).
        key = (table.name, partition, token, timeout_ms, max_lag_records, max_lag_ms)
        found = self._consistencies.get(key)
        if found is None:
            found = self._token_consistency(table, partition, options)
            if len(self._consistencies) >= TOKENS_KEPT:
                self._consistencies.clear()
            self._consistencies[key] = found
        return found

    def _token_consistency(
        self, table: QueryTable, partition: int, options: ReadOptions
    ) -> Consistency:
        token, timeout_ms = options.consistent_with, options.timeout_ms
        max_lag_records, max_lag_ms = options.max_lag_records, options.max_lag_ms
        assert token is not None
        try:
            decoded = _decoded_token(token, self.app_id, self.positions.sources)
        except TokenError as error:
            raise BadRequest(f"consistent_with: {error}") from None
        sources = self._sources_of(table)
        if decoded.topic not in sources:
            raise BadRequest(
                f"consistent_with: a token of {decoded.topic}, which does not feed "
                f"{table.name} (fed by {', '.join(sorted(sources)) or 'no source topic'})"
            )
        beyond = sorted(p for p in decoded.positions if p >= self.positions.partitions)
        if beyond:
            raise BadRequest(
                f"consistent_with: the token names partition {beyond[0]} of {decoded.topic}, "
                f"which has {self.positions.partitions}"
            )
        if table.kind == "global":  # each partition of its topic holds its own keys
            feeding = [partition]
        else:
            feeding = self.positions.feeding(table.name, decoded.topic, partition)
        wanted = {p: o for p, o in decoded.positions.items() if p in feeding}
        return Consistency(
            token,
            decoded.topic,
            wanted,
            DEFAULT_WAIT_MS if timeout_ms is None else timeout_ms,
            max_lag_records,
            max_lag_ms,
        )

    def _sources_of(self, table: QueryTable) -> dict[str, str]:
        """The source topics of a table: a global table's is the topic it is kept from."""
        if table.kind == "global":
            return {table.topic: "direct"}
        return self.positions.sources_of(table.name)

    def query(
        self,
        table: QueryTable,
        key: str,
        at: int | None,
        start: int | None,
        end: int | None,
        options: ReadOptions | None = None,
    ) -> KeyQuery:
        raw = encode_key(key)
        partition = partition_for(raw, table.partitions)
        consistency = self.consistency(table, partition, options) if options else NO_CONSISTENCY
        if table.kind != "windowed":
            if at is not None or start is not None or end is not None:
                raise BadRequest(f"at, from and to apply to windowed tables; {table.name} is not")
            return KeyQuery(table, key, raw, partition, consistency=consistency)
        if (start is None) != (end is None):
            raise BadRequest("from and to go together")
        if start is not None and end is not None:
            if at is not None:
                raise BadRequest("give either at or from and to, not both")
            if start > end:
                raise BadRequest("from must not be after to")
            return KeyQuery(
                table, key, raw, partition, start=start, end=end, consistency=consistency
            )
        at = int(time.time() * 1000) if at is None else at
        return KeyQuery(table, key, raw, partition, at=at, consistency=consistency)

    def read_now(self, query: KeyQuery, forwarded_by: str | None) -> Answer | None:
        """The answer to a read that needs neither a wait nor another worker (a global
        table; this worker's active copy, or any copy of its own for a forwarded read,
        when the read names no token or the copy holds the token's position already), or
        None when :meth:`read` must answer it. Raises what :meth:`read` would raise for
        such a read."""
        if query.table.kind == "global":
            position = self.global_position(query.table, query.partition)
            if query.consistency.missing(position):
                return None
            return self._serve_global(query, position)
        copy = self.local.copy(query.table, query.partition)
        if copy is None or (copy.replica != "active" and forwarded_by is None):
            return None
        # Nothing awaits between the copy's lookup and its read: no rebalance closes it.
        # An active copy's held position may understate its database's (never overstate
        # it): a token it holds is held by the database, and one it misses is waited for
        # by read(), on the database's position.
        consistency = query.consistency
        position = self.position(copy, held=not consistency.bounded)
        if consistency.wanted and consistency.missing(position):
            return None
        return self._serve_held(query, copy, position)

    async def read(self, query: KeyQuery, forwarded_by: str | None) -> Answer:
        """Answer a key read from the best copy that can answer it, within the read's
        timeout from start to end (every hop and every wait shares one deadline).

        A read this worker answers its client 504 (no copy reached its token's position
        in time) counts once in ``streamstate_position_wait_timeouts``; a copy that timed
        out on the way to another copy's answer does not, and neither does a peer's
        forwarded read (the worker that answers the client counts it)."""
        try:
            answer = await self._read(query, forwarded_by)
        except NotYet:
            if forwarded_by is None:
                self.waits.timeouts += 1
            raise
        if answer.status == 504 and forwarded_by is None:
            self.waits.timeouts += 1  # the owner's own 504, relayed
        return answer

    async def _read(self, query: KeyQuery, forwarded_by: str | None) -> Answer:
        if query.table.kind == "global":
            return await self._read_global(query)
        deadline = time.monotonic() + query.wait_s
        asking = BOUNDED_PATIENCE_S if query.consistency.bounded else self.patience_s
        patience = time.monotonic() + max(query.wait_s, asking)
        while True:
            copy = self.local.copy(query.table, query.partition)
            if forwarded_by is not None:
                if copy is None:
                    raise NotHeldHere(
                        f"{self.routing.own_url} holds no copy of {query.table.name} "
                        f"partition {query.partition}"
                    )
                return await self._serve(query, copy, deadline)
            if copy is not None and copy.replica == "active":
                try:
                    return await self._serve(query, copy, deadline)
                except NotHeldHere:
                    copy = None  # closed by a rebalance meanwhile: ask the other copies
            try:
                return await self._route(query, copy, deadline)
            except OwnerMoved:
                continue  # the partition has a new owner: ask it, in the time left
            except NoReplica as refused:
                # No copy answered: the group is rebalancing (a worker died, say), and
                # the partition's copies answer again within moments. Ask anew, owner
                # first, until the read's patience runs out.
                if time.monotonic() >= patience:
                    logger.warning("%s", refused.detail)
                    raise
                await asyncio.sleep(PEER_RETRY_SECONDS)

    def forward_owner(self, query: KeyQuery, forwarded_by: str | None) -> str | None:
        """The peer to ask first for a plain read (no consistency, no window) that this
        worker's active copy cannot answer: the partition's owner; None for any other
        read, or when the owner is unknown."""
        if forwarded_by is not None or not query.plain:
            return None
        copy = self.local.copy(query.table, query.partition)
        if copy is not None and copy.replica == "active":
            return None
        owner = self.routing.owner(query.table, query.partition)
        return None if owner is None or owner == self.routing.own_url else owner

    def read_many_now(
        self, table: QueryTable, keys: list[str], forwarded_by: str
    ) -> list[tuple[int, Any]] | None:
        """Plain reads of ``keys`` in ``table``, each answered as a forwarded read (from this
        worker's own copy): (status, body) per key, or None when some read must wait
        (:meth:`read_many` answers them all then)."""
        found: list[tuple[int, Any]] = []
        for key in keys:
            try:
                query = self.query(table, key, None, None, None)
                answer = self.read_now(query, forwarded_by)
            except QueryError as error:
                found.append((error.status, error.body()))
                continue
            if answer is None:
                return None
            found.append((answer.status, answer.body))
        return found

    async def read_many(
        self, table: QueryTable, keys: list[str], forwarded_by: str
    ) -> list[tuple[int, Any]]:
        """:meth:`read_many_now`, waiting for the reads that must."""
        found: list[tuple[int, Any]] = []
        for key in keys:
            try:
                answer = await self.read(self.query(table, key, None, None, None), forwarded_by)
            except QueryError as error:
                found.append((error.status, error.body()))
                continue
            found.append((answer.status, answer.body))
        return found

    async def _route(self, query: KeyQuery, copy: LocalCopy | None, deadline: float) -> Answer:
        """A read this worker holds no active copy for: the owner's answer, else the best
        copy's. Raises :class:`OwnerMoved` when the partition changes hands while a local
        standby waits for the read's position."""
        owner = self.routing.owner(query.table, query.partition)
        candidates: list[PeerAnswer | None] = []
        #: copies that answered but could not serve the read (behind its token or bound)
        refusals: list[PeerAnswer] = []
        if owner is not None and owner != self.routing.own_url:
            # The owner has applied at least what this worker's standby has: when the
            # standby holds the token's position already, so does the owner, which
            # answers at once; it is not waited for beyond the grace (a stopped owner
            # would hold the read for its whole timeout, with the answer here).
            held_here = (
                copy is not None
                and bool(query.consistency.wanted)
                and not query.consistency.missing(self.position(copy))
            )
            answer = await self._ask(owner, query, deadline, purpose="owner", patient=not held_here)
            if answer is not None and answer.status == 504 and isinstance(answer.body, dict):
                return Answer(504, answer.body)  # the owner waited the read's whole timeout
            relayed = owners_answer(answer)
            if relayed is not None:
                return relayed
            if answer is not None and relayable(answer):
                candidates.append(answer)  # the owner is restoring: maybe behind a standby
            elif answer is not None and refused_at(answer):
                refusals.append(answer)
        if copy is not None:

            def moved() -> bool:
                return self.routing.owner(query.table, query.partition) != owner

            try:
                local = await self._serve(query, copy, deadline, moved=moved)
            except (NotYet, NoReplica) as refused:
                # This standby is behind the read's position or bound: its position is
                # the answer if no other copy can serve the read.
                local = None
                refusals.append(PeerAnswer(self.routing.own_url, refused.status, refused.body()))
            except NotHeldHere:
                local = None  # closed by a rebalance meanwhile
            if local is not None:
                if copy.offset_lag == 0:
                    return local
                candidates.append(PeerAnswer(self.routing.own_url, local.status, local.body))
        return await self._from_peers(query, owner, candidates, refusals, deadline)

    async def _ask(
        self, url: str, query: KeyQuery, deadline: float, *, purpose: str, patient: bool = True
    ) -> PeerAnswer | None:
        """One peer's answer to ``query``, given what is left of the read's timeout;
        ``patient`` False: the peer has no reason to wait for the read's position, and is
        given the grace only."""
        if query.plain:  # sent with the other plain reads of the peer in this turn
            return await self.peers.read_soon(url, query.table.name, query.key, purpose=purpose)
        remaining = max(0.0, deadline - time.monotonic())
        params = query.params_within(remaining)
        # A read with a token has the client's own timeout: a peer that has not answered
        # a little after it ends (stopped, say) is given up on, and the other copies
        # answer in the time left, so the read ends near its timeout_ms.
        grace = ANSWER_GRACE_S if query.consistency.wanted else None
        wait = remaining if patient else 0.0
        return await self.peers.get(
            url, query.path, params, purpose=purpose, wait=wait, grace=grace
        )

    async def _from_peers(
        self,
        query: KeyQuery,
        owner: str | None,
        candidates: list[PeerAnswer | None],
        refusals: list[PeerAnswer],
        deadline: float,
    ) -> Answer:
        """The best answer of every copy; when none can serve the read, the refusal of
        the copy closest to serving it (504 with its position and what it waits for, 503
        with its position and lag), else a 503: no copy answered at all."""
        peers = [url for url in self.routing.peers() if url != owner]
        answers = await asyncio.gather(
            *(self._ask(url, query, deadline, purpose="standby") for url in peers)
        )
        best = best_answer(candidates + list(answers))
        if best is not None:
            return Answer(best.status, best.body)
        refusals = refusals + [a for a in answers if a is not None and refused_at(a)]
        logger.debug(
            "no copy of %s[%d] served the read: owner %s, peers %s",
            query.table.name,
            query.partition,
            owner,
            [(url, a.status if a else None) for url, a in zip(peers, answers, strict=True)],
        )
        raise self._refused(query, owner, refusals)

    def _refused(
        self, query: KeyQuery, owner: str | None, refusals: list[PeerAnswer]
    ) -> QueryError:
        """What a read no copy served answers: a copy's "not yet" (504) before its "too
        stale" (503), and of several, the least behind; else that no copy answered."""
        name, partition = query.table.name, query.partition
        waited = [a for a in refusals if a.status == 504]
        if waited:
            closest = min(waited, key=behind)
            return NotYet(
                str(closest.body.get("detail", "")),
                extra={
                    "position": closest.body.get("position"),
                    "waiting_for": closest.body.get("waiting_for", {}),
                },
            )
        stale = [a for a in refusals if a.status == 503]
        if stale:
            closest = min(stale, key=behind)
            return NoReplica(
                f"no copy of {name} partition {partition} could answer; the closest, "
                f"{closest.url}: {closest.body.get('detail', '')}",
                extra={"position": closest.body.get("position")},
            )
        if query.consistency.bounded:
            return NoReplica(
                f"no copy of {name} partition {partition} is within the read's staleness "
                f"bound (owner {owner or 'unassigned'})",
                extra={"position": None},
            )
        return NoReplica(
            f"no copy of {name} partition {partition} answered "
            f"(owner {owner or 'unassigned'}); the group may be rebalancing"
        )

    def position(self, copy: LocalCopy, *, held: bool = False) -> ReadPosition:
        """The copy's read position; ``held``: of an active copy, as the engine last
        wrote it (for a read with no consistency bound: a position that may lag the
        database after a revocation only understates what the answer holds)."""
        name, partition = copy.table.name, copy.partition
        if held and copy.replica == "active":
            stored = self.held.get(name, partition, copy.stored_position)
        else:
            stored = copy.stored_position()
        return self.positions.of(name, partition, stored)

    async def _serve(
        self,
        query: KeyQuery,
        copy: LocalCopy,
        deadline: float,
        moved: Callable[[], bool] | None = None,
    ) -> Answer:
        """Answer from this worker's ``copy`` once it holds the read's position (waiting
        until the read's deadline, or until ``moved`` says the partition has a new
        owner), if it is within the read's staleness bound."""
        consistency = query.consistency
        position = self.position(copy)
        if consistency.wanted:
            while missing := consistency.missing(position):
                if moved is not None and moved():
                    raise OwnerMoved(query.table.name, query.partition)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise NotYet(
                        f"{copy.replica} copy of {query.table.name} partition "
                        f"{query.partition} did not reach the token's position in "
                        f"{consistency.timeout_ms} ms",
                        extra={"position": position.as_dict(), "waiting_for": missing},
                    )
                await self.waits.next_move(min(remaining, 0.05))
                found = self.local.copy(query.table, query.partition)
                if found is None:  # revoked meanwhile
                    raise NotHeldHere(f"{self.routing.own_url} no longer holds the partition")
                copy, position = found, self.position(found)
        return self._serve_held(query, copy, position)

    def _serve_held(self, query: KeyQuery, copy: LocalCopy, position: ReadPosition) -> Answer:
        """Answer from ``copy``, which holds the read's position (if it names one), if it
        is within the read's staleness bound."""
        consistency = query.consistency
        if consistency.bounded and (why := consistency.beyond(position)):
            raise NoReplica(
                f"{copy.replica} copy of {query.table.name} partition {query.partition}: {why}",
                extra={"position": position.as_dict()},
            )
        answer = self._answer(query, copy)
        answer.body["position"] = position.as_dict()
        unbounded = not consistency.wanted and not consistency.bounded
        if unbounded and copy.replica != "active" and absent(answer.status, answer.body):
            raise NoReplica(
                f"the {copy.replica} copy of {query.table.name} partition {query.partition} "
                f"does not hold key {query.key!r} and may not have it yet (offset_lag "
                f"{copy.offset_lag}); only the active copy answers that a key is absent",
                extra={"position": position.as_dict()},
            )
        return answer

    def _meta(self, query: KeyQuery, replica: str, lag: int | None) -> dict[str, Any]:
        return {
            "table": query.table.name,
            "key": query.key,
            "partition": query.partition,
            "served_by": self.routing.own_url,
            "replica": replica,
            "offset_lag": lag,
        }

    def _absent(self, query: KeyQuery, meta: dict[str, Any], what: str = "") -> Answer:
        detail = f"key {query.key!r} not found in {query.table.name}{what}"
        return Answer(404, {"detail": detail, **meta})

    def _answer(self, query: KeyQuery, copy: LocalCopy) -> Answer:
        meta = self._meta(query, copy.replica, copy.offset_lag)
        if query.table.kind != "windowed":
            value = copy.get(query.raw)
            if value is None:
                return self._absent(query, meta)
            return Answer(200, {**meta, "value": value})
        windows = copy.windows(query.key)
        if query.at is not None:
            window = window_at(windows, query.at)
            if window is None:
                what = f" for a window holding {query.at}"
                retention = query.table.retention_ms
                if retention is not None and query.at < time.time() * 1000 - retention:
                    kept = time_span(retention)
                    what += f" (the table keeps windows {kept}: older ones are gone)"
                return self._absent(query, meta, what)
            span = {"start": window.start, "end": window.end}
            return Answer(200, {**meta, "value": window.value, "window": span})
        found = windows_between(windows, query.start or 0, query.end or 0)
        return Answer(200, {**meta, "windows": [w.as_dict() for w in found]})

    def global_position(self, table: QueryTable, partition: int) -> ReadPosition:
        """The read position of this worker's copy of a global table's partition: the
        offset it has applied of that partition of the table's topic."""
        copy = table.copy
        assert copy is not None, f"{table.name} is not a global table"
        return self.positions.of_topic(table.topic, partition, copy.applied(partition))

    async def _read_global(self, query: KeyQuery) -> Answer:
        """Answer from this worker's copy of a global table once it holds the read's
        position (every worker keeps the whole table: no other worker is asked)."""
        deadline = time.monotonic() + query.wait_s
        consistency = query.consistency
        position = self.global_position(query.table, query.partition)
        while missing := consistency.missing(position):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise NotYet(
                    f"this worker's copy of the global table {query.table.name} did not "
                    f"reach the token's position in {consistency.timeout_ms} ms",
                    extra={"position": position.as_dict(), "waiting_for": missing},
                )
            await self.waits.next_move(min(remaining, 0.05))
            position = self.global_position(query.table, query.partition)
        return self._serve_global(query, position)

    def _serve_global(self, query: KeyQuery, position: ReadPosition) -> Answer:
        """Answer from this worker's copy of a global table, which holds the read's
        position (if it names one), if it is within the read's staleness bound."""
        copy = query.table.copy
        assert copy is not None, f"{query.table.name} is not a global table"
        consistency, shown = query.consistency, position.as_dict()
        name, partition = query.table.name, query.partition
        if consistency.bounded and (why := consistency.beyond(position)):
            raise NoReplica(
                f"this worker's copy of the global table {name}, partition {partition}: {why}",
                extra={"position": shown},
            )
        lag = global_lag(copy, partition)
        meta = self._meta(query, "global", lag)
        value = copy.document(query.key)
        if value is not None:
            return Answer(200, {**meta, "value": value, "position": shown})
        if lag != 0 and not consistency.wanted and not consistency.bounded:
            raise NoReplica(
                f"this worker's copy of {name} is behind partition {partition} (offset_lag "
                f"{lag}): it does not hold key {query.key!r} and may not have it yet",
                extra={"position": shown},
            )
        answer = self._absent(query, meta)
        answer.body["position"] = shown
        return answer


def time_span(ms: int) -> str:
    """A length of time in its largest whole unit: ``7 days``, ``1 hours``, ``90 seconds``."""
    for unit, size in (("days", 86_400_000), ("hours", 3_600_000), ("minutes", 60_000)):
        if ms >= size and ms % size == 0:
            return f"{ms // size} {unit}"
    return f"{ms / 1000:g} seconds"


def global_lag(copy: Any, partition: int) -> int | None:
    """Records of one partition of a global table's topic this worker has not applied."""
    try:
        lag: int | None = copy.partition_lag(partition)
    except Exception:  # the table's consumer has not fetched that partition yet
        return None
    return lag
