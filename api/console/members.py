"""What each worker of the group holds and does, for the console's Group and Topology views.

Each worker reports on itself only (:meth:`WorkerReports.own`, served to its peers at
``/internal/console/worker``): the table partitions it holds as active or standby copies
with their lag, the source partitions its tasks read with their lag, its restore, its
last rebalances and its rates. :meth:`WorkerReports.group` gathers every member's report,
asking only the members of the group's assignment metadata. The Topology view needs only
the rates and the sources' lag of each member (:meth:`WorkerReports.flow`, served at
``/internal/console/flow``): gathering the positions of a worker's copies costs it a read
of each partition database, several milliseconds per report.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import Any

from api.console.sampler import FigureSampler
from api.positions import InputEnds, Positions
from api.queries import Queries
from tables.engine import TP, ServedStore
from tables.membership import WorkerView
from tables.rebalances import RebalanceLog

#: Points of throughput history each report carries (one per second).
HISTORY_POINTS = 60


def _pairs(rates: Mapping[tuple[str, str], float], second: str) -> list[dict[str, Any]]:
    return [
        {"pipeline": pipeline, second: name, "per_s": round(rate, 2)}
        for (pipeline, name), rate in sorted(rates.items())
    ]


class WorkerReports:
    """This worker's report, and the whole group's."""

    def __init__(
        self,
        worker: WorkerView,
        queries: Queries,
        ends: InputEnds,
        sampler: FigureSampler,
        rebalances: RebalanceLog,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.worker = worker
        self.queries = queries
        self.ends = ends
        self.sampler = sampler
        self.rebalances = rebalances
        self.clock = clock

    @property
    def positions(self) -> Positions:
        return self.queries.positions

    def changelogs(self) -> dict[str, str]:
        """Every declared table's changelog topic, mapped to the table's name."""
        stores = self.worker.stores
        return {store.changelog_topic: name for name, store in stores.items()}

    def own(self) -> dict[str, Any]:
        """This worker's report (see :class:`api.console.schemas.MemberReport`)."""
        names = self.changelogs()
        active, standby = self.queries.routing.own_assignment()
        rename = {t: names.get(t, t) for t in (*active, *standby)}
        return {
            "url": self.queries.routing.own_url,
            "reachable": True,
            "status": self.status(),
            "failure": self.worker.engine.failure,
            "generation": self.worker.membership.generation,
            "sampled_at": round(self.clock(), 3),
            "active": {rename[t]: ps for t, ps in active.items()},
            "standby": {rename[t]: ps for t, ps in standby.items()},
            "copies": self.copies(names, active, standby),
            "sources": self.sources(),
            "restore": self.restore(names),
            "rebalances": self.rebalances.last(),
            "rates": self._rates(),
            "history": self.sampler.history(HISTORY_POINTS),
        }

    def flow(self) -> dict[str, Any]:
        """What the Topology view needs of this worker's report: its rates and the lag of
        the source partitions it reads."""
        return {
            "url": self.queries.routing.own_url,
            "reachable": True,
            "status": self.status(),
            "sampled_at": round(self.clock(), 3),
            "sources": self.sources(),
            "rates": self._rates(),
        }

    def _rates(self) -> dict[str, Any]:
        flow = self.sampler.flow()
        return {
            "seconds": round(flow.seconds, 3),
            "read": _pairs(flow.read, "topic"),
            "written": _pairs(flow.written, "table"),
            "sent": _pairs(flow.sent, "topic"),
        }

    def status(self) -> str:
        """failed, rebalancing, recovering, idle (no partition) or running."""
        membership = self.worker.membership
        if self.worker.engine.failure is not None:
            return "failed"
        if membership.rebalancing:
            return "rebalancing"
        assignment = membership.assignment()
        if assignment is None:  # no assignment before the first rebalance
            return "idle"
        if membership.restore_progress()["remaining_total"]:
            return "recovering"
        return "running" if assignment.actives else "idle"

    def copies(
        self,
        names: Mapping[str, str],
        active: Mapping[str, list[int]],
        standby: Mapping[str, list[int]],
    ) -> list[dict[str, Any]]:
        """Each table partition held here: its kind of copy, how far it is behind its
        inputs (``lag_records``, ``lag_ms``) and behind its changelog (``changelog_lag``)."""
        stores = self.worker.stores
        found = []
        for replica, held in (("active", active), ("standby", standby)):
            for topic, partitions in sorted(held.items()):
                name = names.get(topic)
                if name is None:
                    continue
                for partition in partitions:
                    found.append(self._copy(name, stores[name], topic, partition, replica))
        return found

    def _copy(
        self, name: str, store: ServedStore, topic: str, partition: int, replica: str
    ) -> dict[str, Any]:
        try:
            stored = store.position(partition)
            position = self.positions.of(name, partition, stored)
            lag_records, lag_ms = position.lag_records, position.lag_ms
        except Exception:  # the partition's database is still locked by a rebalance
            lag_records, lag_ms = None, None
        return {
            "table": name,
            "partition": partition,
            "replica": replica,
            "lag_records": lag_records,
            "lag_ms": lag_ms,
            "changelog_lag": self._changelog_lag(store, topic, partition),
        }

    def _changelog_lag(self, store: ServedStore, topic: str, partition: int) -> int | None:
        highwater = self.worker.membership.highwater(TP(topic, partition))
        if highwater is None:
            return None
        try:
            persisted = store.persisted_offset(partition)
        except Exception:  # the partition's database is still locked by a rebalance
            return None
        return max(0, highwater - 1 - (-1 if persisted is None else persisted))

    def sources(self) -> list[dict[str, Any]]:
        """Each topic partition this worker's tasks read: the next offset to apply, the
        end offset, and the lag in records and in ms."""
        now = time.monotonic()
        found = []
        for task in list(self.worker.engine.tasks.values()):
            for tp, offset in sorted(task.checkpoint.next.items()):
                end = self.ends.end(tp.topic, tp.partition)
                done = offset or 0
                lag = None if end is None else max(0, end - done)
                age = self.ends.age_ms(tp.topic, tp.partition, done, now) if lag else 0
                found.append(
                    {
                        "topic": tp.topic,
                        "partition": tp.partition,
                        "next_offset": offset,
                        "end_offset": end,
                        "lag_records": lag,
                        "lag_ms": age if lag is not None else None,
                    }
                )
        return found

    def restore(self, names: Mapping[str, str]) -> dict[str, Any]:
        """The restore of the active partitions: per partition the offset restored and
        the target, and this process's restore figures."""
        try:
            progress = self.worker.membership.restore_progress()
        except Exception:  # the table manager is not started yet
            return {"in_progress": False, "remaining_total": 0, "partitions": [], "stats": None}
        partitions = []
        for key, entry in progress["partitions"].items():
            topic, _, partition = key.rpartition(":")
            partitions.append({"table": names.get(topic, topic), "partition": int(partition)})
            partitions[-1].update(entry)
        stats = progress.get("restore") or {}
        return {
            "in_progress": bool(stats.get("in_progress")),
            "remaining_total": progress["remaining_total"],
            "partitions": partitions,
            "stats": stats or None,
        }

    async def group(self) -> list[dict[str, Any]]:
        """Every member's report (a member that does not answer: ``reachable`` false)."""
        return await self._gather(self.own(), ("/internal/console/worker",))

    async def group_flows(self) -> list[dict[str, Any]]:
        """Every member's :meth:`flow`; a member that does not serve it yet (an older
        version, during a rolling upgrade) is asked for its whole report."""
        paths = ("/internal/console/flow", "/internal/console/worker")
        return await self._gather(self.flow(), paths)

    async def _gather(self, own: dict[str, Any], paths: tuple[str, ...]) -> list[dict[str, Any]]:
        routing = self.queries.routing
        peers = routing.peers()
        answers = await asyncio.gather(*(self._ask(url, paths) for url in peers))
        reports = {routing.own_url: own}
        for url, answer in zip(peers, answers, strict=True):
            if answer is not None and answer.status == 200 and isinstance(answer.body, dict):
                reports[url] = answer.body
            else:
                reports[url] = {"url": url, "reachable": False, "status": "unreachable"}
        return [reports[url] for url in sorted(reports)]

    async def _ask(self, url: str, paths: tuple[str, ...]) -> Any:
        answer = None
        for path in paths:
            answer = await self.queries.peers.get(url, path, {}, purpose="console")
            if answer is None or answer.status != 404:
                break
        return answer
