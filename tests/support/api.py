"""The FastAPI app of a worker, built around a stand-in worker, for unit tests."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI

from api.app import create_api
from core.settings import Settings
from streams.loading import load
from tables.engine import TP, Engine
from tables.membership import Assignment, WorkerView
from tables.pipeline import Context
from tables.rebalances import RebalanceLog
from tables.restore import RestoreStats

APP_ID = "streamstate"


@dataclass
class FixedMembership:
    """A :class:`~tables.membership.Membership` that never changes: a worker alone,
    with the assignment given (None: before its first), nothing to restore, and no
    peer."""

    actives: frozenset[TP] | None = None
    standbys: frozenset[TP] = frozenset()
    app_id: str = APP_ID
    canonical_url: str = "http://127.0.0.1:6066"
    rebalancing: bool = False
    generation: int | None = None
    rebalances: RebalanceLog = field(default_factory=RebalanceLog)

    def assignment(self) -> Assignment | None:
        if self.actives is None:
            return None
        return Assignment(self.actives, self.standbys)

    def hosts(self) -> Mapping[str, Mapping[str, Sequence[int]]]:
        return {}

    def highwater(self, tp: TP) -> int | None:
        return None

    def restore_highwater(self, tp: TP) -> int | None:
        return None

    def restore_progress(self) -> dict[str, Any]:
        return {"partitions": {}, "remaining_total": 0, "rebalancing": False, "restore": None}

    def restore_remaining(self) -> Mapping[TP, int]:
        return {}

    def restore_stats(self) -> RestoreStats | None:
        return None

    def broker_connected(self) -> bool | None:
        return None

    def on_revoked(self, receiver: Callable[[], Awaitable[None]]) -> None:
        pass

    async def remove_static_members(self, instance_ids: Sequence[str]) -> dict[str, str]:
        return dict.fromkeys(instance_ids, "removed")


def worker_view(
    settings: Settings, engine: Engine, membership: FixedMembership | None = None
) -> WorkerView:
    """A worker of ``settings``' pipelines' source topics whose engine is ``engine``."""
    context = Context(settings.topic_partitions, settings.max_event_bytes, 86_400_000)
    loaded = load(settings.pipeline_modules, context)
    return WorkerView(
        settings=settings,
        membership=membership or FixedMembership(),
        engine=engine,
        stores={},
        served={},
        globals={},
        inputs={topic: loaded.sources.get(topic) for topic in loaded.inputs},
        pipelines=[],
    )


def make_api(token: str | None = None, bootstrap: str = "127.0.0.1:9", **settings: Any) -> FastAPI:
    """create_api() of a worker that has no assignment yet, with the pipelines of
    ``Settings.pipelines`` declared; ``settings`` override Settings fields."""
    config = Settings(broker_url=bootstrap, api_token=token, **settings)
    # An engine with no pipeline: the query layer registers its listener on it.
    engine = Engine([], {}, None, partitions=8, exactly_once=False)  # type: ignore[arg-type]
    return create_api(worker_view(config, engine))
