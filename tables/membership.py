"""What the query layer may know of its worker: one typed door.

The HTTP API (``api/``) reads the worker's place in its consumer group, its restore and
its stores through :class:`WorkerView` only; ``tables/faust_adapter.py`` implements
:class:`Membership` over faust (:class:`~tables.faust_adapter.FaustMembership`), and the
composition root (``app/main.py``) builds the view. Unit tests build a view over a
membership of their own.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from core.settings import Settings
from tables.engine import TP, Engine, ServedStore
from tables.global_table import GlobalTableService
from tables.pipeline import Pipeline, SourceSpec, TableKind
from tables.rebalances import RebalanceLog
from tables.restore import RestoreStats
from tables.windows import AnyWindow


class Assignment(NamedTuple):
    """This worker's topic partitions (source topics and changelogs alike)."""

    actives: frozenset[TP]
    standbys: frozenset[TP]


class Membership(Protocol):
    """The worker's membership of its consumer group, its consumer and its restore."""

    @property
    def app_id(self) -> str:
        """The application id: the group, and the prefix of the changelog topics."""
        ...

    @property
    def canonical_url(self) -> str:
        """The URL the group's peers reach this worker at."""
        ...

    @property
    def rebalancing(self) -> bool:
        """True while the group rebalances or the new assignment restores."""
        ...

    @property
    def generation(self) -> int | None:
        """The group generation this worker joined last."""
        ...

    def assignment(self) -> Assignment | None:
        """This worker's current assignment; None before the first one."""
        ...

    def hosts(self) -> Mapping[str, Mapping[str, Sequence[int]]]:
        """Every member's URL with its active changelog partitions by topic (members
        with none too); empty before the first assignment."""
        ...

    def highwater(self, tp: TP) -> int | None:
        """The next offset of an assigned partition as the group's consumer last saw
        it, or None when it has not fetched the partition."""
        ...

    def restore_highwater(self, tp: TP) -> int | None:
        """The next offset of a changelog partition as this worker's restore measured
        it (active or standby), or None when it restores no such partition."""
        ...

    def restore_progress(self) -> dict[str, Any]:
        """Per active changelog partition the offset restored and the target, with the
        total still to restore, ``rebalancing`` and the :class:`RestoreStats`."""
        ...

    def restore_remaining(self) -> Mapping[TP, int]:
        """Changelog records each active partition still has to restore."""
        ...

    def restore_stats(self) -> RestoreStats | None:
        """This process's restore figures (None before the table manager starts)."""
        ...

    def broker_connected(self) -> bool | None:
        """Whether the group's consumer holds a live broker connection (None: not
        started)."""
        ...

    def on_revoked(self, receiver: Callable[[], Awaitable[None]]) -> None:
        """Call ``receiver`` whenever the group revokes this worker's partitions."""
        ...

    @property
    def rebalances(self) -> RebalanceLog:
        """The group's last rebalances as this worker took part in them, recorded from
        before its first one."""
        ...

    async def remove_static_members(self, instance_ids: Sequence[str]) -> dict[str, str]:
        """Remove dead static members from the group on their behalf; each id's
        outcome (``removed`` or the broker's error)."""
        ...


@dataclass(frozen=True)
class ServedTable:
    """A table the HTTP API serves: its declaration's kind and window, its partitions."""

    name: str
    kind: TableKind
    partitions: int
    window: AnyWindow | None = None


@dataclass(frozen=True)
class WorkerView:
    """Everything the HTTP API is given of its worker."""

    settings: Settings
    membership: Membership
    engine: Engine
    #: every table's store, by name: the very stores the engine writes through
    stores: Mapping[str, ServedStore]
    #: the queryable tables of the pipelines, by name
    served: Mapping[str, ServedTable]
    #: every global table's local copy, by name (:mod:`tables.global_table`)
    globals: Mapping[str, GlobalTableService]
    #: the topics records may be written to (POST /topics), with their declared types
    inputs: Mapping[str, SourceSpec | None]
    #: every pipeline the engine runs
    pipelines: Sequence[Pipeline]
