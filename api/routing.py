"""Where a key lives: its partition, the worker that owns it, and the group's members.

Partitions are computed here from the raw UTF-8 key bytes with the producer's murmur2,
not through ``app.router.key_store``: the windowed table's changelog keys are JSON, but
its records are partitioned by the raw category bytes of the repartition topic, and
``key_store`` raises KeyError before the first assignment anyway. Owners come only from
the group's assignment metadata (``app.router.tables_metadata()``), never from a request.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

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
    #: The faust table; a global table's copy (tables/global_table.py) for a global one.
    table: Any
    #: The windows of a windowed table.
    window: AnyWindow | None = None


def query_tables(worker: Any) -> dict[str, QueryTable]:
    """Every queryable table of a worker, by name."""
    found: dict[str, QueryTable] = {}
    for name, info in worker.wiring.tables.infos().items():
        table = info.table
        found[name] = QueryTable(
            name=name,
            kind=info.kind,
            topic=table.changelog_topic.get_topic_name(),
            partitions=int(table.partitions or worker.conf.topic_partitions),
            standby_replicas=int(worker.conf.table_standby_replicas),
            table=table,
            window=info.spec.window,
        )
    for name, copy in worker.wiring.globals.items():
        found[name] = QueryTable(
            name=name,
            kind="global",
            topic=copy.spec.topic,
            partitions=int(worker.settings.topic_partitions),
            standby_replicas=0,
            table=copy,
        )
    return found


class Routing:
    """The group's assignment metadata, read fresh on every call (it changes on rebalance)."""

    def __init__(self, worker: Any) -> None:
        self.worker = worker

    @property
    def own_url(self) -> str:
        return normalize_url(self.worker.conf.canonical_url)

    def actives_by_host(self) -> dict[str, dict[str, list[int]]]:
        """Every member's URL with its active changelog partitions (members with none too)."""
        try:
            metadata = self.worker.router.tables_metadata()
        except Exception:  # before the first assignment
            return {}
        return {
            normalize_url(url): {topic: sorted(parts) for topic, parts in topics.items()}
            for url, topics in (metadata or {}).items()
        }

    def members(self) -> list[str]:
        """The URLs of the group's members, this worker included."""
        return sorted(set(self.actives_by_host()) | {self.own_url})

    def peers(self) -> list[str]:
        """The other members: the only hosts a read may be forwarded to."""
        return [url for url in self.members() if url != self.own_url]

    def owner(self, table: QueryTable, partition: int) -> str | None:
        """The URL of the active owner of a table partition, or None when unassigned."""
        for url, topics in self.actives_by_host().items():
            if partition in topics.get(table.topic, ()):
                return url
        return None

    def own_assignment(self) -> tuple[dict[str, list[int]], dict[str, list[int]]]:
        """This worker's active and standby changelog partitions."""
        assignor = self.worker.assignor
        return _by_topic(_safe_set(assignor.assigned_actives)), _by_topic(
            _safe_set(assignor.assigned_standbys)
        )


def _safe_set(read: Any) -> set[Any]:
    try:
        return set(read())
    except Exception:  # the assignor has no assignment before the first rebalance
        return set()


def _by_topic(tps: set[Any]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for tp in tps:
        if tp.topic.endswith("-changelog"):
            out.setdefault(tp.topic, []).append(tp.partition)
    return {topic: sorted(parts) for topic, parts in sorted(out.items())}
