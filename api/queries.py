"""Key reads: answered locally by the active copy, else by the active owner, else by a
standby (this worker's or a peer's); 503 only when no copy answers.

A read that arrives with the forwarding marker is answered from this worker's own copy
or refused with 421, never forwarded again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

from aiokafka import TopicPartition

from api.errors import BadRequest, NoReplica, NotFound, NotHeldHere
from api.local import LocalCopy, LocalState, Window
from api.peers import PeerAnswer, Peers, quote_segment
from api.routing import QueryTable, Routing, query_tables
from app.topics import partition_for

logger = logging.getLogger(__name__)

#: Longest accepted key, in UTF-8 bytes.
MAX_KEY_BYTES = 1024
#: How often the peers are asked before a read gives up with 503, and the pause between.
PEER_ATTEMPTS = 3
PEER_RETRY_SECONDS = 0.3


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


@dataclass(frozen=True)
class KeyQuery:
    """A validated key read."""

    table: QueryTable
    key: str
    raw: bytes
    partition: int
    at: int | None = None
    start: int | None = None
    end: int | None = None

    @property
    def path(self) -> str:
        return f"/tables/{quote_segment(self.table.name)}/keys/{quote_segment(self.key)}"

    @property
    def params(self) -> dict[str, Any]:
        return {"at": self.at, "from": self.start, "to": self.end}


@dataclass(frozen=True)
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


def trustworthy(answer: PeerAnswer) -> bool:
    """A 200 from any copy, or a 404 from a copy known to be caught up.

    A standby or restoring copy that lags (or cannot say its lag) may simply not have
    received the key yet: its "absent" is not an answer.
    """
    if answer.status == 200:
        return True
    return bool(answer.body.get("replica") == "active" or answer.body.get("offset_lag") == 0)


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
    return next((w for w in windows if w.start <= at < w.end), None)


def windows_between(windows: list[Window], start: int, end: int) -> list[Window]:
    """Windows that overlap ``[start, end]``."""
    return [w for w in windows if w.start <= end and w.end > start]


class Queries:
    """Answers key reads for one worker."""

    def __init__(self, worker: Any, peers: Peers) -> None:
        self.worker = worker
        self.routing = Routing(worker)
        self.local = LocalState(worker)
        self.peers = peers
        self._tables: dict[str, QueryTable] | None = None

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

    def query(
        self, table: QueryTable, key: str, at: int | None, start: int | None, end: int | None
    ) -> KeyQuery:
        raw = encode_key(key)
        partition = partition_for(raw, table.partitions)
        if table.kind != "windowed":
            if at is not None or start is not None or end is not None:
                raise BadRequest(f"at, from and to apply to windowed tables; {table.name} is not")
            return KeyQuery(table, key, raw, partition)
        if (start is None) != (end is None):
            raise BadRequest("from and to go together")
        if start is not None and end is not None:
            if at is not None:
                raise BadRequest("give either at or from and to, not both")
            if start > end:
                raise BadRequest("from must not be after to")
            return KeyQuery(table, key, raw, partition, start=start, end=end)
        return KeyQuery(
            table, key, raw, partition, at=int(time.time() * 1000) if at is None else at
        )

    async def read(self, query: KeyQuery, forwarded_by: str | None) -> Answer:
        """Answer a key read from the best copy that can answer it."""
        if query.table.kind == "global":
            return self._read_global(query)
        copy = self.local.copy(query.table, query.partition)
        if copy is not None and copy.replica == "active":
            return self._answer(query, copy)
        if forwarded_by is not None:
            if copy is None:
                raise NotHeldHere(
                    f"{self.routing.own_url} holds no copy of {query.table.name} "
                    f"partition {query.partition}"
                )
            return self._answer(query, copy)
        owner = self.routing.owner(query.table, query.partition)
        candidates: list[PeerAnswer | None] = []
        if owner is not None and owner != self.routing.own_url:
            answer = await self.peers.get(owner, query.path, query.params, purpose="owner")
            if answer is not None and relayable(answer):
                if answer.status not in (200, 404) or answer.body.get("replica") == "active":
                    return Answer(answer.status, answer.body)
                candidates.append(answer)  # the owner is restoring: maybe behind a standby
        if copy is not None:
            local = self._answer(query, copy)
            if copy.offset_lag == 0:
                return local
            candidates.append(PeerAnswer(self.routing.own_url, local.status, local.body, {}))
        return await self._from_peers(query, owner, candidates)

    async def _from_peers(
        self, query: KeyQuery, owner: str | None, candidates: list[PeerAnswer | None]
    ) -> Answer:
        peers = [url for url in self.routing.peers() if url != owner]
        best: PeerAnswer | None = None
        for attempt in range(PEER_ATTEMPTS):
            if attempt:
                # Copies catch up within moments of a failover; ask again before a 503.
                await asyncio.sleep(PEER_RETRY_SECONDS)
            answers = await asyncio.gather(
                *(self.peers.get(url, query.path, query.params, purpose="standby") for url in peers)
            )
            best = best_answer(candidates + list(answers))
            if best is not None:
                break
        if best is None:
            logger.warning(
                "no copy of %s[%d] answered: owner %s, peers %s",
                query.table.name,
                query.partition,
                owner,
                [(url, a.status if a else None) for url, a in zip(peers, answers, strict=True)],
            )
            raise NoReplica(
                f"no copy of {query.table.name} partition {query.partition} answered "
                f"(owner {owner or 'unassigned'}); the group may be rebalancing"
            )
        return Answer(best.status, best.body)

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
                return self._absent(query, meta, f" for a window holding {query.at}")
            span = {"start": window.start, "end": window.end}
            return Answer(200, {**meta, "value": window.value, "window": span})
        found = windows_between(windows, query.start or 0, query.end or 0)
        return Answer(200, {**meta, "windows": [w.as_dict() for w in found]})

    def _read_global(self, query: KeyQuery) -> Answer:
        catalog = self.worker.wiring.catalog
        meta = self._meta(query, "global", catalog_lag(catalog, query.partition))
        value = catalog.get(query.key)
        if value is None:
            return self._absent(query, meta)
        return Answer(200, {**meta, "value": value})


def catalog_lag(catalog: Any, partition: int) -> int | None:
    """Records of one products partition the worker's catalogue has not applied yet."""
    try:
        highwater = catalog._consumer.highwater(TopicPartition(catalog.topic, partition))
        if highwater is None:
            return None
        return max(0, int(highwater) - int(catalog._stored_offset(partition)))
    except Exception:  # the catalogue has not started or fetched that partition yet
        return None
