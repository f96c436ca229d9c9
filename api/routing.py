"""Where a key lives: its partition, the worker that owns it, and the group's members.

Partitions are computed here from the raw UTF-8 key bytes with the producer's murmur2,
not through faust's ``router.key_store``: the windowed table's changelog keys are JSON, but
its records are partitioned by the raw category bytes of the repartition topic, and
``key_store`` raises KeyError before the first assignment anyway. Owners come only from
the group's assignment metadata (:meth:`~tables.membership.Membership.hosts`), never
from a request.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Literal

from tables.engine import TP, ServedStore
from tables.global_table import GlobalTableService
from tables.membership import Membership, WorkerView
from tables.windows import AnyWindow

Kind = Literal["table", "windowed", "global"]


def normalize_url(url: Any) -> str:
    return str(url).rstrip("/")


@dataclass(frozen=True)
class QueryTable:
    """A table as the query layer sees it."""

    name: str
    kind: Kind
    #: The topic whose partitions hold the table: its changelog, or a global table's topic.
    topic: str
    partitions: int
    standby_replicas: int
    #: The engine's store of a table or windowed table (None for a global one).
    store: ServedStore | None = None
    #: A global table's copy (:mod:`tables.global_table`; None for the others).
    copy: GlobalTableService | None = None
    #: The windows of a windowed table.
    window: AnyWindow | None = None
    #: How long a windowed table keeps a window after it ends (ms): an older one is not
    #: served, though it stays stored until its partition's next write removes it.
    retention_ms: int | None = None


def window_retention_ms(window: AnyWindow | None, default_days: float) -> int | None:
    """A windowed table's retention: its window's own, else the worker's default."""
    if window is None:
        return None
    own = window.retention_ms
    return int(default_days * 86_400_000) if own is None else own


def query_tables(worker: WorkerView) -> dict[str, QueryTable]:
    """Every queryable table of a worker, by name: the stores are the engine's own."""
    settings = worker.settings
    found: dict[str, QueryTable] = {}
    for name, served in worker.served.items():
        found[name] = QueryTable(
            name=name,
            kind=served.kind,
            topic=worker.stores[name].changelog_topic,
            partitions=served.partitions,
            standby_replicas=settings.table_standby_replicas,
            store=worker.stores[name],
            window=served.window,
            retention_ms=window_retention_ms(served.window, settings.window_retention_days),
        )
    for name, copy in worker.globals.items():
        found[name] = QueryTable(
            name=name,
            kind="global",
            topic=copy.spec.topic,
            partitions=settings.topic_partitions,
            standby_replicas=0,
            copy=copy,
        )
    return found


class Routing:
    """The group's assignment metadata, read fresh on every call (it changes on rebalance)."""

    def __init__(self, membership: Membership) -> None:
        self.membership = membership
        #: the hosts :meth:`owner` last indexed, and the owner of each changelog partition
        self._owners_of: Any = None
        self._owners: dict[tuple[str, int], str] = {}

    @functools.cached_property
    def own_url(self) -> str:
        """This worker's URL (its canonical URL is set once, before the API starts)."""
        return normalize_url(self.membership.canonical_url)

    def actives_by_host(self) -> dict[str, dict[str, list[int]]]:
        """Every member's URL with its active changelog partitions (members with none too)."""
        return {
            normalize_url(url): {topic: sorted(parts) for topic, parts in topics.items()}
            for url, topics in self.membership.hosts().items()
        }

    def members(self) -> list[str]:
        """The URLs of the group's members, this worker included."""
        return sorted(set(self.actives_by_host()) | {self.own_url})

    def peers(self) -> list[str]:
        """The other members: the only hosts a read may be forwarded to."""
        return [url for url in self.members() if url != self.own_url]

    def owner(self, table: QueryTable, partition: int) -> str | None:
        """The URL of the active owner of a table partition, or None when unassigned."""
        hosts = self.membership.hosts()
        if hosts is not self._owners_of:  # a new assignment (or a membership that copies)
            owners: dict[tuple[str, int], str] = {}
            for url, topics in hosts.items():
                for topic, parts in topics.items():
                    for p in parts:
                        owners.setdefault((topic, p), normalize_url(url))
            self._owners, self._owners_of = owners, hosts
        return self._owners.get((table.topic, partition))

    def own_assignment(self) -> tuple[dict[str, list[int]], dict[str, list[int]]]:
        """This worker's active and standby changelog partitions."""
        assignment = self.membership.assignment()
        if assignment is None:
            return {}, {}
        return _by_topic(assignment.actives), _by_topic(assignment.standbys)


def _by_topic(tps: frozenset[TP]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for tp in tps:
        if tp.topic.endswith("-changelog"):
            out.setdefault(tp.topic, []).append(tp.partition)
    return {topic: sorted(parts) for topic, parts in sorted(out.items())}
