"""The operator's console: a page at ``/ui`` (``api/console/assets/``) and the JSON routes
it reads (``api/routes/console.py``), served by every worker."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any

from api.background import pause, stopped
from api.console.dead_letters import DeadLetterTail
from api.console.members import WorkerReports
from api.console.nightly import NightlyReports
from api.console.replay_log import ReplayLog, replay_log_topic
from api.console.replays import Replayer
from api.console.sampler import FigureSampler
from api.positions import InputEnds
from api.queries import Queries
from core.topics import dlq_topic
from tables.membership import WorkerView

logger = logging.getLogger(__name__)


def readers_of(pipelines: Iterable[Any]) -> dict[str, list[str]]:
    """Per source topic, the pipelines that read it."""
    found: dict[str, list[str]] = {}
    for pipeline in pipelines:
        for topic in pipeline.reads:
            found.setdefault(topic, []).append(pipeline.name)
    return found


class Console:
    """What the console's routes read: the sampled figures, the members' reports, the
    dead letters and their replays, the nightly report."""

    def __init__(self, worker: WorkerView, queries: Queries, ends: InputEnds) -> None:
        settings = worker.settings
        engine = worker.engine
        self.worker = worker
        self.pipelines = worker.pipelines
        self.sampler = FigureSampler(lambda: engine.figures)
        self.rebalances = worker.membership.rebalances
        self.reports = WorkerReports(worker, queries, ends, self.sampler, self.rebalances)
        #: every dead-letter topic of the loaded pipelines -> its source topic
        self.dead_letter_sources = {
            dlq_topic(topic): topic for p in self.pipelines for topic in p.reads
        }
        self.dead_letters = DeadLetterTail(
            settings.bootstrap_servers, self.dead_letter_sources, settings.topic_partitions
        )
        self.replay_log = ReplayLog(
            settings.bootstrap_servers,
            replay_log_topic(worker.membership.app_id),
            settings.topic_replication_factor,
        )
        self.replayer = Replayer(
            settings.bootstrap_servers,
            self.replay_log,
            self.dead_letter_sources,
            worker.inputs,
            settings.topic_partitions,
            settings.max_event_bytes,
            queries.routing.own_url,
            readers=readers_of(self.pipelines),
        )
        self.nightly = NightlyReports(settings.nightly_reports)
        self._warm_up: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()

    def table_kinds(self) -> dict[str, str]:
        """The queryable tables' kinds (table, windowed, global)."""
        return {name: served.kind for name, served in self.worker.served.items()}

    def start(self) -> None:
        """Start sampling the figures; once the worker runs its first assignment, start
        reading the dead letters and the replay log in the background, so that the Dead
        letters view's first answer does not wait for them (a request starts them anyway)."""
        self.sampler.start()
        self._warm_up = asyncio.ensure_future(self._start_readers())

    async def _start_readers(self) -> None:
        # Not before: the topics of a new cluster have no leaders for a moment, and the
        # readers' first requests would fail (and be logged) until they have.
        while self.reports.status() != "running":
            if self._stopping.is_set():
                return
            await pause(self._stopping, 0.5)
        self.dead_letters.start()
        try:
            await self.replay_log.start()
        except Exception as error:  # no broker now: the first request starts it again
            logger.info("the replay log starts on first use: %r", error)

    async def stop(self) -> None:
        await stopped(self._warm_up, self._stopping)
        await asyncio.gather(self.sampler.stop(), self.dead_letters.stop(), self.replay_log.stop())
