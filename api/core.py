"""What a worker's HTTP API serves with, apart from its routes and web framework.

:class:`ApiCore` holds the query layer (:class:`~api.queries.Queries` and what it
reads positions, peers and waits from), the producer of the write routes, the change
hub, the console and the metrics registry, and starts and stops their background work.
It imports no web framework: the worker's front app (api/front.py) serves key reads
and readiness with it while FastAPI's modules are still being imported, and the FastAPI
app (api/app.py) is built over the same core.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from prometheus_client import CollectorRegistry

from api.changes import ChangeHub, Changes, global_changes
from api.console import Console
from api.members import DeadMembers
from api.metrics import WorkerCollector
from api.peers import Peers
from api.positions import (
    ConsistencyCollector,
    HeldPositions,
    InputEnds,
    Positions,
    PositionWaits,
)
from api.producer import RecordProducer
from api.queries import Queries
from api.routing import Routing, normalize_url
from api.scans import Scans
from tables.membership import WorkerView

#: How often reads waiting for a position look at the standby copies again, in seconds.
STANDBY_RECHECK_S = 0.05


class ApiCore:
    """The API's state over one worker (``worker`` is all it knows of the worker)."""

    def __init__(self, worker: WorkerView) -> None:
        self.worker = worker
        settings = worker.settings
        membership = worker.membership
        self.peers = Peers(
            normalize_url(membership.canonical_url),
            settings.api_token,
            settings.forward_timeout,
            streams=settings.relayed_streams,
        )
        self.producer = RecordProducer(
            settings.bootstrap_servers, client_id=f"{membership.app_id}-api"
        )
        engine = worker.engine
        kept = {copy.spec.topic for copy in worker.globals.values()}
        self.ends = InputEnds(
            settings.bootstrap_servers,
            engine.topics | kept,
            settings.topic_partitions,
            read_committed=settings.exactly_once,
        )
        self.inputs = dict(worker.inputs)
        positions = Positions(engine.lineage, settings.topic_partitions, self.inputs, self.ends)
        self.waits = waits = PositionWaits()
        self.held = held = HeldPositions()
        self.hub = hub = ChangeHub()

        def after_cycle(
            table: str,
            partition: int,
            changes: Mapping[bytes, bytes | None],
            position: bytes | None,
        ) -> None:
            held.moved(table, partition, position)
            waits.notify()
            hub.on_cycle(table, partition, changes, position)

        engine.listeners.append(after_cycle)

        def after_global(partition: int) -> None:
            if waits.waiting:
                waits.notify()

        for name, copy in worker.globals.items():
            copy.listeners.append(after_global)
            copy.change_listeners.append(global_changes(hub, name, copy))

        async def on_revoked() -> None:
            held.forget()
            hub.moved()

        membership.on_revoked(on_revoked)
        routing = Routing(membership)
        self.dead_members = DeadMembers(
            routing.peers,
            membership.remove_static_members,
            probes=settings.dead_member_probes,
        )
        # Members are named by their canonical URL only when instance ids are left at
        # their default; with ids of the operator's choosing, dead members wait for their
        # sessions.
        self._watch_members = settings.evict_dead_members and settings.group_instance_id is None
        self.queries = Queries(worker, self.peers, positions, waits, held)
        self.scans = Scans(self.queries)
        self.changes = Changes(self.queries, hub)
        self.console = Console(worker, self.queries, self.ends)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(WorkerCollector(worker))
        self.registry.register(ConsistencyCollector(waits, hub))
        self._tasks: list[asyncio.Future[None]] = []

    async def _recheck_waits(self) -> None:
        # Standby copies move when faust flushes their changelog records, which calls no
        # listener: reads waiting for a position look again now and then.
        while True:
            await asyncio.sleep(STANDBY_RECHECK_S)
            if self.waits.waiting:
                self.waits.notify()

    async def start(self) -> None:
        """Start the background work: the producer's connection, the input ends, the
        position rechecks, the watch over dead members and the console."""
        self.producer.warm_up()
        self.ends.start()
        self._tasks.append(asyncio.ensure_future(self._recheck_waits()))
        if self._watch_members:
            self._tasks.append(asyncio.ensure_future(self.dead_members.run()))
        self.console.start()

    async def stop(self) -> None:
        """Stop the background work; the clients close side by side (at a worker's stop,
        its group's consumer closes, and the worker leaves its group, after them)."""
        for task in self._tasks:
            task.cancel()
        self._tasks.clear()
        self.hub.moved()
        await asyncio.gather(
            self.console.stop(), self.ends.stop(), self.producer.stop(), self.peers.close()
        )
