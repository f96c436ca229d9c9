"""Key scans across the group: each partition read from its active owner (or a standby),
pages merged in key order, continued with an opaque cursor.

Every partition returns up to ``limit`` keys after the cursor's key; the merge keeps the
first ``limit`` of them, so each key appears exactly once across pages as long as the
partitions answer. The answer says which partitions were served by their active copy,
which only by a standby (``stale``), and which by nobody (``missing``).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
from dataclasses import dataclass, field
from typing import Any

import orjson

from api.errors import BadRequest
from api.local import LocalCopy
from api.peers import PeerAnswer, quote_segment
from api.positions import ReadPosition
from api.queries import Queries, global_lag
from api.routing import QueryTable
from core.topics import partition_for


def encode_cursor(table: str, prefix: str, key: str) -> str:
    payload = orjson.dumps({"t": table, "p": prefix, "k": key})
    return base64.urlsafe_b64encode(payload).decode().rstrip("=")


def decode_cursor(cursor: str, table: str, prefix: str) -> str:
    """The last key of the previous page, or a 400 for a cursor of another scan."""
    if not cursor:
        # An empty cursor is a client's mistake (a next_cursor of null sent as empty), not
        # a request for the first page: that page again would loop a pager for ever.
        raise BadRequest("cursor: empty; the first page is read without a cursor")
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        payload = orjson.loads(base64.urlsafe_b64decode(padded.encode("ascii")))
        key = payload["k"]
        same = payload["t"] == table and payload["p"] == prefix
    except (binascii.Error, ValueError, KeyError, TypeError, UnicodeEncodeError):
        raise BadRequest("cursor: not a cursor of this API") from None
    if not isinstance(key, str) or not same:
        raise BadRequest("cursor: belongs to another table or prefix")
    return key


@dataclass(frozen=True)
class PartitionPage:
    """One partition's keys after the cursor, and whether it has more."""

    partition: int
    replica: str
    offset_lag: int | None
    items: list[dict[str, Any]] = field(default_factory=list)
    more: bool = False
    #: the read position of the copy that answered
    position: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "partition": self.partition,
            "replica": self.replica,
            "offset_lag": self.offset_lag,
            "items": self.items,
            "more": self.more,
            "position": self.position,
        }


def page_of(
    copy: LocalCopy, prefix: str, after: str | None, limit: int, position: ReadPosition
) -> PartitionPage:
    raw_after = after.encode("utf-8") if after is not None else None
    pairs, more = copy.scan(prefix.encode("utf-8"), raw_after, limit)
    items = [{"key": k.decode("utf-8", "replace"), "value": v} for k, v in pairs]
    return PartitionPage(
        copy.partition, copy.replica, copy.offset_lag, items, more, position.as_dict()
    )


def pages_from(answer: PeerAnswer | None) -> list[PartitionPage]:
    if answer is None or answer.status != 200 or not isinstance(answer.body, dict):
        return []
    pages = []
    for page in answer.body.get("partitions", []):
        try:
            pages.append(
                PartitionPage(
                    int(page["partition"]),
                    str(page["replica"]),
                    page.get("offset_lag"),
                    list(page["items"]),
                    bool(page["more"]),
                    page.get("position"),
                )
            )
        except (KeyError, TypeError, ValueError):
            continue
    return pages


def better(page: PartitionPage, other: PartitionPage | None) -> bool:
    if other is None:
        return True
    lag = float("inf") if page.offset_lag is None else page.offset_lag
    other_lag = float("inf") if other.offset_lag is None else other.offset_lag
    return (page.replica != "active", lag) < (other.replica != "active", other_lag)


def merge(
    table: str, prefix: str, pages: dict[int, PartitionPage], partitions: int, limit: int
) -> dict[str, Any]:
    """One page of the whole table from the pages of its partitions."""
    items = sorted(
        ({**item, "partition": page.partition} for page in pages.values() for item in page.items),
        key=lambda item: str(item["key"]).encode("utf-8"),
    )
    more = len(items) > limit or any(page.more for page in pages.values())
    items = items[:limit]
    cursor = encode_cursor(table, prefix, items[-1]["key"]) if more and items else None
    return {
        "items": items,
        "next_cursor": cursor,
        "partitions": {
            "served": sorted(p for p, page in pages.items() if page.replica != "standby"),
            "stale": sorted(p for p, page in pages.items() if page.replica == "standby"),
            "missing": sorted(set(range(partitions)) - set(pages)),
        },
        "positions": {str(p): page.position for p, page in sorted(pages.items()) if page.position},
    }


class Scans:
    """Scans of one worker."""

    def __init__(self, queries: Queries) -> None:
        self.queries = queries

    def local_pages(
        self, table: QueryTable, partitions: list[int], prefix: str, after: str | None, limit: int
    ) -> list[PartitionPage]:
        """Pages of the partitions this worker holds a copy of (active or standby)."""
        pages = []
        for partition in partitions:
            copy = self.queries.local.copy(table, partition)
            if copy is not None:
                pages.append(page_of(copy, prefix, after, limit, self.queries.position(copy)))
        return pages

    async def scan(
        self, table: QueryTable, prefix: str, cursor: str | None, limit: int
    ) -> dict[str, Any]:
        after = None if cursor is None else decode_cursor(cursor, table.name, prefix)
        if table.kind == "global":
            return self._scan_global(table, prefix, after, limit)
        pages: dict[int, PartitionPage] = {}
        remote: dict[str, list[int]] = {}
        routing = self.queries.routing
        for partition in range(table.partitions):
            copy = self.queries.local.copy(table, partition)
            if copy is not None and copy.replica == "active":
                position = self.queries.position(copy)
                pages[partition] = page_of(copy, prefix, after, limit, position)
                continue
            owner = routing.owner(table, partition)
            if owner is not None and owner != routing.own_url:
                remote.setdefault(owner, []).append(partition)
        await self._gather(table, remote, pages, prefix, after, limit, "scan")
        missing = [p for p in range(table.partitions) if p not in pages]
        for page in self.local_pages(table, missing, prefix, after, limit):
            pages[page.partition] = page
        missing = [p for p in range(table.partitions) if p not in pages]
        if missing:
            fallback = {url: missing for url in routing.peers() if url not in remote}
            await self._gather(table, fallback, pages, prefix, after, limit, "scan-standby")
        return merge(table.name, prefix, pages, table.partitions, limit)

    async def _gather(
        self,
        table: QueryTable,
        plan: dict[str, list[int]],
        pages: dict[int, PartitionPage],
        prefix: str,
        after: str | None,
        limit: int,
        purpose: str,
    ) -> None:
        path = f"/internal/tables/{quote_segment(table.name)}/scan"
        urls = list(plan)
        answers = await asyncio.gather(
            *(
                self.queries.peers.get(
                    url,
                    path,
                    {
                        "partitions": ",".join(map(str, plan[url])),
                        "prefix": prefix,
                        "after": after,
                        "limit": limit,
                    },
                    purpose=purpose,
                )
                for url in urls
            )
        )
        for answer in answers:
            for page in pages_from(answer):
                if page.partition < table.partitions and better(page, pages.get(page.partition)):
                    pages[page.partition] = page

    def _scan_global(
        self, table: QueryTable, prefix: str, after: str | None, limit: int
    ) -> dict[str, Any]:
        copy = table.copy
        assert copy is not None, f"{table.name} is not a global table"
        raw_after = after.encode("utf-8") if after is not None else None
        keys = sorted(
            (key for key in copy.keys() if key.startswith(prefix)),  # noqa: SIM118
            key=lambda key: key.encode("utf-8"),
        )
        keys = [k for k in keys if raw_after is None or k.encode("utf-8") > raw_after]
        pages: dict[int, PartitionPage] = {
            p: PartitionPage(
                p,
                "global",
                global_lag(copy, p),
                position=self.queries.global_position(table, p).as_dict(),
            )
            for p in range(table.partitions)
        }
        for key in keys[: limit + 1]:
            partition = partition_for(key.encode("utf-8"), table.partitions)
            pages[partition].items.append({"key": key, "value": copy.document(key)})
        return merge(table.name, prefix, pages, table.partitions, limit)
