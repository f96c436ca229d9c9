"""Build the FastAPI application of a worker."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from importlib.metadata import version

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from prometheus_client import CollectorRegistry

from api.changes import ChangeHub, Changes
from api.console import Console
from api.console.page import add_console_page
from api.docs import add_docs
from api.errors import register_handlers
from api.members import DeadMembers
from api.metrics import WorkerCollector
from api.middleware import LatencyMiddleware
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
from api.routes import console as console_routes
from api.routes import health, internal, metadata, metrics, tables, topics
from api.routing import Routing, normalize_url
from api.scans import Scans
from tables.membership import WorkerView

#: How often reads waiting for a position look at the standby copies again, in seconds.
STANDBY_RECHECK_S = 0.05


def create_api(worker: WorkerView) -> FastAPI:
    """Create the HTTP API of one worker.

    ``worker`` is all the API knows of its worker; routes reach it through
    ``request.app.state.worker``.
    """
    settings = worker.settings
    membership = worker.membership
    peers = Peers(
        normalize_url(membership.canonical_url), settings.api_token, settings.forward_timeout
    )

    producer = RecordProducer(settings.bootstrap_servers, client_id=f"{membership.app_id}-api")
    engine = worker.engine
    ends = InputEnds(
        settings.bootstrap_servers,
        engine.topics,
        settings.topic_partitions,
        read_committed=settings.exactly_once,
    )
    inputs = dict(worker.inputs)
    positions = Positions(engine.lineage, settings.topic_partitions, inputs, ends)
    waits = PositionWaits()
    held = HeldPositions()
    hub = ChangeHub()

    def after_cycle(
        table: str, partition: int, changes: Mapping[bytes, bytes | None], position: bytes | None
    ) -> None:
        held.moved(table, partition, position)
        waits.notify()
        hub.on_cycle(table, partition, changes, position)

    engine.listeners.append(after_cycle)

    async def on_revoked() -> None:
        held.forget()
        hub.moved()

    membership.on_revoked(on_revoked)

    async def recheck_waits() -> None:
        # Standby copies move when faust flushes their changelog records, which calls no
        # listener: reads waiting for a position look again now and then.
        while True:
            await asyncio.sleep(STANDBY_RECHECK_S)
            if waits.waiting:
                waits.notify()

    routing = Routing(membership)
    dead = DeadMembers(
        routing.peers,
        membership.remove_static_members,
        probes=settings.dead_member_probes,
    )
    # Members are named by their canonical URL only when instance ids are left at their
    # default; with ids of the operator's choosing, dead members wait for their sessions.
    watch_members = settings.evict_dead_members and settings.group_instance_id is None

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        producer.warm_up()
        ends.start()
        rechecks = asyncio.ensure_future(recheck_waits())
        watch = asyncio.ensure_future(dead.run()) if watch_members else None
        console.start()
        yield
        await console.stop()
        if watch is not None:
            watch.cancel()
        rechecks.cancel()
        hub.moved()
        await ends.stop()
        await producer.stop()
        await peers.close()

    api = FastAPI(
        title="streamstate",
        summary="Interactive queries over the stream processor's tables, and writes to "
        "its source topics",
        version=version("streamstate"),
        default_response_class=JSONResponse,
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
    )
    add_docs(api)
    api.state.worker = worker
    api.state.hub = hub
    api.state.dead_members = dead
    api.state.producer = producer
    api.state.inputs = inputs
    api.state.queries = queries = Queries(worker, peers, positions, waits, held)
    api.state.scans = Scans(queries)
    api.state.changes = Changes(queries, hub)
    api.state.console = console = Console(worker, queries, ends)
    api.state.worker_registry = registry = CollectorRegistry(auto_describe=False)
    registry.register(WorkerCollector(worker))
    registry.register(ConsistencyCollector(waits, hub))
    register_handlers(api)
    api.add_middleware(LatencyMiddleware)
    for module in (health, tables, topics, metadata, internal, metrics, console_routes):
        api.include_router(module.router)
    api.include_router(topics.listing)
    api.include_router(console_routes.internal)
    add_console_page(api)
    return api
