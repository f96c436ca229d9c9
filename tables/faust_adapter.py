"""Everything that reaches into faust-streaming or aiokafka beyond their public API.

The project keeps faust for what it does well: the App and its worker CLI, the consumer
group with its co-partitioning assignor, tables with their changelog recovery and
standby replicas. The engine (``tables/engine.py``) replaces faust's per-record streams.
What connects the two relies on faust's and aiokafka's internals, so it lives here and
nowhere else, behind a version guard (:func:`check_versions`): a worker refuses to start
on a version outside the tested range. ``tests/integration/test_adapter_contract.py``
runs what this module relies on against the real libraries.

What it does:

* :class:`EngineFetcher` replaces the loop of faust's Fetcher. Records of the engine's
  source topics go to the engine, a whole fetch at a time; changelog records go on to
  faust's recovery and standbys one by one, as faust delivers them.
* :class:`FaustConnector` gives the engine the group's assignment, committed offsets,
  seeks and commits, through the consumer's own thread, and its producers
  (``tables/producers.py``); the engine puts them in order (``tables/engine.py``).
* :class:`FaustTableStore` reads and writes a faust table's RocksDB partitions.
* :class:`TrackedRecovery` is faust's recovery with a bulk path for long changelog
  tails, highwaters that work for transactional changelogs, and restore figures.
* Every copy of a partition stays equal to its changelog: each changelog record carries
  its fetch mark, and recovery leaves out the records fetched before a seek of their
  partition (:func:`tracked_only`; faust's queue is no longer emptied when the flow
  resumes); :class:`EngineTable` writes no record below what a database holds.
* Under ``exactly_once`` the engine owns the transactions (faust itself runs at least
  once): the group's consumer reads ``read_committed`` (:class:`EngineTransport`).
* :func:`remove_static_members` removes a dead worker's static membership from the group
  on its behalf (LeaveGroup v3, which aiokafka does not send).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections import Counter, deque
from collections.abc import (
    Awaitable,
    Callable,
    Collection,
    Iterable,
    Iterator,
    Mapping,
    MutableMapping,
    Sequence,
)
from functools import cached_property, partial
from importlib.metadata import version
from typing import Any

import faust
from aiokafka import AIOKafkaConsumer
from aiokafka import TopicPartition as KafkaTP
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.client import ConnectionGroup
from aiokafka.consumer.fetcher import FetchResult, OffsetResetStrategy
from aiokafka.errors import (
    CommitFailedError,
    ConsumerStoppedError,
    IllegalStateError,
    KafkaError,
    for_code,
)
from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.types import Array, Int16, Int32, Schema, String
from faust import stores as faust_stores
from faust.exceptions import ConsistencyError
from faust.stores.rocksdb import RocksDBOptions
from faust.stores.rocksdb import Store as RocksStore
from faust.tables import TableManager
from faust.tables.recovery import E_PERSISTED_OFFSET, RebalanceAgain, Recovery, ServiceStopped
from faust.transport.consumer import Fetcher
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import tuples as faust_tuples
from mode import Service
from rocksdict import WriteBatch

from core.admin import topic_configs
from core.topics import POSITION_KEY
from tables.engine import TP, CommitRefused, Engine, Producer
from tables.limits import TopicLimits, topic_limits
from tables.membership import Assignment
from tables.producers import SharedProducer, TransactionalProducer
from tables.rebalances import RebalanceLog
from tables.restore import RestoreStats, bulk_plan

logger = logging.getLogger(__name__)

# -- the tested versions ---------------------------------------------------------------

#: package -> (lowest tested version, first version not tested)
TESTED = {"faust-streaming": ((0, 15, 3), (0, 15, 4)), "aiokafka": ((0, 14, 0), (0, 15, 0))}


class UnsupportedVersion(RuntimeError):
    """faust-streaming or aiokafka is outside the range this adapter was tested with."""


def _parse(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def check_versions(found: Mapping[str, str] | None = None) -> None:
    """Raise :class:`UnsupportedVersion` naming the version found and the tested range."""
    for package, (low, high) in TESTED.items():
        text = found[package] if found is not None else version(package)
        if not low <= _parse(text) < high:
            tested = f">={'.'.join(map(str, low))},<{'.'.join(map(str, high))}"
            raise UnsupportedVersion(
                f"{package} {text} is installed; streamstate is tested with {package}"
                f"{tested}: install a tested version (pip install '{package}{tested}')"
            )


# -- the group's consumer ----------------------------------------------------------------


class _ConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    read_committed = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: Per partition, how often the recovery or the engine's connector has sought
        #: it (counted on this thread).
        self.seeks: Counter[Any] = Counter()
        #: Per partition of the last fetch, its :func:`fetch_mark` when its records were
        #: handed out. Set on this thread, where the seeks run too.
        self.fetched_marks: dict[Any, FetchMark] = {}
        #: Per partition of the last fetch, the position its records follow on from (its
        #: first record, or the transaction markers before it), where known: no seek or
        #: reset moved the position while the fetch waited.
        self.fetched_starts: dict[Any, int] = {}

    def verify_event_path(self, now: float, tp: Any) -> None:
        """faust's stall detector, for the changelogs only: it judges a partition by
        faust's own streams and acks, which the engine's source records never pass
        through (the engine reports its lag itself)."""
        engine = getattr(self.consumer.app, "engine", None)
        if engine is not None and tp.topic in engine.topics:
            return None
        return super().verify_event_path(now, tp)

    async def _seek_wait(self, consumer: AIOKafkaConsumer, partitions: Mapping[Any, int]) -> None:
        for tp in partitions:
            self.seeks[tp] += 1
        await super()._seek_wait(consumer, partitions)

    async def seek_to_committed(self) -> Mapping[Any, Any]:
        """faust's seek of every assigned partition to its committed offset, at the end
        of each recovery, in one request to the coordinator: aiokafka's asks one
        partition at a time, which for a worker's hundred-odd partitions (sources,
        changelogs, dead letters) held a restart back about 0.3 s before it was ready."""
        result: Mapping[Any, Any] = await self.call_thread(
            seek_all_to_committed, self._ensure_consumer()
        )
        return result

    async def _fetch_records(
        self,
        consumer: AIOKafkaConsumer,
        active_partitions: Any,
        timeout: float | None = None,  # noqa: ASYNC109 (faust's signature)
        max_records: int | None = None,
    ) -> Any:
        before = {}
        for tp in active_partitions:
            mark = fetch_mark(self, tp)
            if mark[0] is not None and mark[0].has_valid_position:
                before[tp] = (mark, int(mark[0].position))
        engine: Engine | None = getattr(self.consumer.app, "engine", None)
        cap = None if engine is None else engine.catch_up.cap()
        if engine is None or cap is None:
            records = await super()._fetch_records(
                consumer, active_partitions, timeout=timeout, max_records=max_records
            )
        else:
            records, left_behind = await capped_fetch(
                partial(super()._fetch_records, consumer),
                consumer._fetcher,
                active_partitions,
                timeout,
                max_records,
                cap,
                engine.topics,
            )
            engine.catch_up.fetched(left_behind)
        self.fetched_marks = marks = {tp: fetch_mark(self, tp) for tp in records or ()}
        # aiokafka hands out the records that follow on from a partition's position: the
        # position before the fetch, unless a seek or a new assignment (a new mark) moved
        # it meanwhile.
        starts = {}
        for tp, batch in (records or {}).items():
            found = before.get(tp)
            if (
                found is not None
                and batch
                and found[0] == marks[tp]
                and batch[0].offset >= found[1]
            ):
                starts[tp] = found[1]
        self.fetched_starts = starts
        return records

    async def on_thread_stop(self) -> None:
        settings = getattr(self.consumer.app, "settings", None)
        if self._consumer is not None and getattr(settings, "leave_group_on_stop", False):
            leave_at_close(self._consumer)
        try:
            await super().on_thread_stop()
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # this thread itself is cancelled
            # aiokafka's Fetcher.close() awaits the fetch requests it has just cancelled,
            # so a stop while one backs off (Kafka unreachable) raises their
            # CancelledError. The consumer thread would die before it tells the worker,
            # and the worker would wait for it until killed. Its connections close here.
            logger.info("the consumer stopped while a fetch was backing off")
            client = getattr(self._consumer, "_client", None)
            if client is not None:
                await client.close()

    def _create_worker_consumer(self, transport: Any) -> AIOKafkaConsumer:
        consumer = super()._create_worker_consumer(transport)
        start = consumer.start

        async def start_then_positions_at_once() -> None:
            await start()
            positions_at_once(consumer._fetcher, consumer._coordinator)

        consumer.start = start_then_positions_at_once
        settings = getattr(self.consumer.app, "settings", None)
        wait_ms = getattr(settings, "source_fetch_max_wait_ms", None)
        idle_ms = getattr(settings, "source_fetch_idle_wait_ms", None)
        if wait_ms is not None:
            app = self.consumer.app

            def handed_out(tp: Any) -> bool:
                # faust keeps the changelogs of active tables assigned and paused for
                # good (fetched, never handed out); a source partition it pauses comes
                # back soon (at a recovery's end, at a stall's retry)
                active = getattr(app.consumer, "_active_partitions", None)
                engine = getattr(app, "engine", None)
                return (active is not None and tp in active) or (
                    engine is not None and tp.topic in engine.topics
                )

            idle = None if idle_ms is None else int(idle_ms)
            fetch_max_wait(consumer, int(wait_ms), idle, handed_out)
        if self.read_committed:
            # faust reads committed records only when it runs transactions itself; here
            # the engine runs them, so faust runs at least once.
            read_committed(consumer)
        return consumer


async def capped_fetch(
    fetch: Callable[..., Awaitable[Any]],
    fetcher: Any,
    partitions: Collection[Any],
    wait_s: float | None,
    max_records: int | None,
    cap: int,
    sources: Collection[str],
) -> tuple[dict[Any, list[Any]], bool]:
    """A fetch of ``partitions`` that hands out at most ``cap`` records of each partition
    of a ``sources`` topic (:mod:`tables.catchup`); the rest stays in aiokafka's
    ``fetcher`` buffer, the consumer's position after what was handed out. ``fetch`` is
    the consumer thread's fetch: (partitions, timeout=, max_records=) -> records.
    Returns the records and whether a source partition has records left behind.

    The first call waits as a plain fetch would (at most ``wait_s``), for at most
    ``cap`` records in all; each partition with records still buffered is then taken on
    its own without waiting. A partition whose buffered fetch holds an error is left to
    the next plain fetch, which raises it, so that records already handed out are never
    lost with it."""
    records: dict[Any, list[Any]] = {
        tp: list(batch)
        for tp, batch in (await fetch(partitions, timeout=wait_s, max_records=cap)).items()
    }
    for tp in [tp for tp in fetcher._records if tp in partitions]:
        if not isinstance(fetcher._records.get(tp), FetchResult):
            continue
        most = cap - len(records.get(tp, ())) if tp.topic in sources else max_records
        if most is not None and most <= 0:
            continue
        more = (await fetch({tp}, timeout=0, max_records=most)).get(tp)
        if more:
            records.setdefault(tp, []).extend(more)
    buffered = fetcher._records
    left_behind = any(
        tp.topic in sources and isinstance(buffered[tp], FetchResult) and buffered[tp].has_more()
        for tp in list(buffered)
        if tp in partitions
    )
    return records, left_behind


async def seek_all_to_committed(consumer: AIOKafkaConsumer) -> dict[Any, int | None]:
    """What ``AIOKafkaConsumer.seek_to_committed()`` does for all assigned partitions,
    with their committed offsets read in one request: each partition with a committed
    offset above 0 is sought to it (one revoked meanwhile is left alone); returns every
    assigned partition's committed offset, None where there is none."""
    partitions = consumer.assignment()
    if not partitions:
        return {}
    found = await consumer._coordinator.fetch_committed_offsets(list(partitions))
    still = consumer.assignment()
    committed: dict[Any, int | None] = {}
    for tp in partitions:
        meta = found.get(tp)
        offset = None if meta is None or meta.offset == -1 else meta.offset
        committed[tp] = offset
        if offset and offset > 0 and tp in still:
            consumer._fetcher.seek_to(tp, offset)
    return committed


def fetch_max_wait(
    consumer: AIOKafkaConsumer,
    wait_ms: int,
    idle_ms: int | None = None,
    handed_out: Callable[[Any], bool] | None = None,
) -> None:
    """Set how long the broker may hold a fetch of an aiokafka consumer that is not
    started yet (faust sets 1,500 ms and offers no setting): ``wait_ms``, or ``idle_ms``
    for a fetch that leaves out none of the consumer's partitions (see
    :func:`adapt_fetch_wait`)."""
    consumer._fetch_max_wait_ms = wait_ms
    if idle_ms is None or idle_ms == wait_ms:
        return
    start = consumer.start

    async def start_then_adapt() -> None:
        await start()
        adapt_fetch_wait(consumer._fetcher, wait_ms, idle_ms, handed_out)

    consumer.start = start_then_adapt


def positions_at_once(fetcher: Any, coordinator: Any) -> None:
    """At each new assignment, aiokafka's ``fetcher`` learns the committed offsets of all
    its partitions without a position in one request to the group ``coordinator``.

    aiokafka asks for them one partition at a time (``Fetcher._update_fetch_positions``
    awaits each partition's before it asks for the next), and sends no fetch to a broker
    while a partition there waits for its position: after each rebalance, a worker's
    hundred-odd partitions (sources, the changelogs of its actives and standbys) made as
    many requests in a row, 0.1-0.2 s before its sources' first fetch. Here each
    partition with a committed offset starts from it, as aiokafka would start it, and
    each without one waits for aiokafka's reset, all of them in one offset lookup; a
    partition that a seek or aiokafka gave a position meanwhile keeps it. When the
    request fails, aiokafka's own way takes over."""
    if coordinator is None:
        return
    plan = fetcher._get_actions_per_node
    state: dict[str, Any] = {"assignment": None}
    running: set[asyncio.Future[None]] = set()

    async def settle(assignment: Any) -> None:
        tps = [
            tp
            for tp in assignment.tps
            if not assignment.state_value(tp).has_valid_position
            and not assignment.state_value(tp).awaiting_reset
        ]
        if not tps:
            return
        try:
            found = await coordinator.fetch_committed_offsets(tps)
        except KafkaError as exc:
            logger.debug("committed offsets of the assignment in one request: %r", exc)
            return
        if not assignment.active:
            return
        strategy = fetcher._default_reset_strategy
        for tp in tps:
            tp_state = assignment.state_value(tp)
            if tp_state.has_valid_position or tp_state.awaiting_reset:
                continue
            meta = found.get(tp)
            if meta is not None and meta.offset >= 0:
                tp_state.reset_to(meta.offset)
            elif strategy != OffsetResetStrategy.NONE:
                tp_state.await_reset(strategy)
        fetcher._notify(fetcher._wait_consume_future)

    def actions(assignment: Any) -> Any:
        if assignment is not state["assignment"]:
            state["assignment"] = assignment
            task = asyncio.ensure_future(settle(assignment))
            running.add(task)
            task.add_done_callback(running.discard)
        return plan(assignment)

    fetcher._get_actions_per_node = actions


def adapt_fetch_wait(
    fetcher: Any, wait_ms: int, idle_ms: int, handed_out: Callable[[Any], bool] | None = None
) -> None:
    """Each fetch request of aiokafka's ``fetcher`` asks the broker to hold it at most
    ``idle_ms`` when it leaves out no partition that may soon be fetched, else
    ``wait_ms``.

    The fetcher keeps one request in flight per broker, and a request leaves out the
    partitions whose records are still buffered, paused or without a position: those
    are fetched again only once it returns, which the short wait bounds. A request that
    leaves out none returns as soon as any partition has a record, so the broker may
    hold it long. ``handed_out(tp)`` tells the partitions whose records the consumer's
    user takes, now or soon (default: every one); the others do not count."""
    plan = fetcher._get_actions_per_node

    def actions(assignment: Any) -> Any:
        short = leaves_out(fetcher, assignment, handed_out)
        fetcher._fetch_max_wait_ms = wait_ms if short else idle_ms
        return plan(assignment)

    fetcher._get_actions_per_node = actions


def leaves_out(
    fetcher: Any, assignment: Any, handed_out: Callable[[Any], bool] | None = None
) -> bool:
    """Whether a fetch request built now would leave out an assigned partition whose
    records are handed out (``handed_out``): one with records still buffered, paused,
    or without a position."""
    buffered = fetcher._records
    for tp in assignment.tps:
        state = assignment.state_value(tp)
        left_out = tp in buffered or state.paused or not state.has_valid_position
        # the predicate last: on every turn of the fetcher's loop, most partitions are in
        if left_out and (handed_out is None or handed_out(tp)):
            return True
    return False


def read_committed(consumer: AIOKafkaConsumer) -> None:
    """Make an aiokafka consumer that is not started yet read committed records only."""
    consumer._isolation_level = "read_committed"


class _Consumer(faust_aiokafka.Consumer):
    def _new_consumer_thread(self) -> _ConsumerThread:
        thread = _ConsumerThread(self, loop=self.loop, beacon=self.beacon)
        thread.read_committed = bool(getattr(self.app, "read_committed", False))
        return thread


class EngineTransport(faust_aiokafka.Transport):
    """faust's aiokafka transport whose group consumer can read ``read_committed``."""

    Consumer = _Consumer


def aiokafka_consumer(app: faust.App) -> AIOKafkaConsumer | None:
    """The group's aiokafka consumer (it runs on the consumer's own thread)."""
    consumer: Any = app.consumer
    found: AIOKafkaConsumer | None = consumer._thread._consumer
    return found


def _partition_state(consumer: Any, tp: Any) -> Any:
    """aiokafka's state of an assigned partition (None: not assigned, or no consumer)."""
    try:
        return consumer._subscription.subscription.assignment.state_value(tp)
    except AttributeError:
        return None


def consumer_position(consumer: Any, tp: Any) -> int | None:
    """An aiokafka consumer's fetch position of an assigned partition, without a
    request (past the transaction markers it has skipped), or None when it has none."""
    state = _partition_state(consumer, tp)
    if state is None or not state.has_valid_position:
        return None
    return int(state.position)


#: Which stretch of a partition's records a fetch belongs to: the consumer's state of the
#: partition (new at each assignment) and the number of seeks made on it (the recovery's
#: and the engine's connector's).
FetchMark = tuple[Any, int]


def fetch_mark(thread: Any, tp: Any) -> FetchMark:
    """The current :data:`FetchMark` of ``tp`` on a worker's consumer thread."""
    return (_partition_state(thread._consumer, tp), thread.seeks[tp])


def _position(app: faust.App, tp: Any) -> int | None:
    return consumer_position(aiokafka_consumer(app), tp)


def consumer_connected(consumer: Any) -> bool | None:
    """True if an aiokafka consumer holds a live broker connection, False if it holds
    none, None before it has started."""
    try:
        client = consumer._client
        if client._sync_task is None:  # not bootstrapped (not started, or stopped)
            return None
        connections = client._conns
    except AttributeError:
        return None
    return any(connection.connected() for connection in list(connections.values()))


def broker_connected(app: faust.App) -> bool | None:
    """Whether the group's consumer holds a live broker connection (None: not started)."""
    return consumer_connected(aiokafka_consumer(app))


async def _in_thread(app: faust.App, fun: Any, *args: Any) -> Any:
    consumer: Any = app.consumer
    return await consumer._thread.call_thread(fun, *args)


class EngineApp(faust.App):
    """faust.App whose source records go to the engine: its transport's group consumer
    reads ``read_committed`` when asked to, and its fetcher is :class:`EngineFetcher`."""

    #: under exactly_once the group's consumer reads committed records only
    read_committed: bool = False

    def _new_transport(self) -> Any:
        return EngineTransport(self.conf.broker_consumer, self)

    @cached_property
    def _fetcher(self) -> Any:
        return EngineFetcher(self, loop=self.loop, beacon=self.consumer.beacon)

    async def _stop_fetcher(self) -> None:
        """faust stops the fetch loop first when the worker stops (and only then): the
        engine's last cycle is committed by then, and the worker leaves its group at
        once, before its tables, its HTTP API and the rest of the app stop (about a
        second in which its partitions would wait for it)."""
        await super()._stop_fetcher()
        await leave_group_now(self)


class AssignedSets:
    """This worker's active and standby topic partitions, worked out once per assignment.

    faust's assignor builds a new set of named tuples at each ``assigned_actives()``
    call; a key read asks for it every time, so the sets are kept until the assignor
    holds another assignment (it replaces its assignment object at each rebalance).
    """

    def __init__(self, assignor: Any) -> None:
        self.assignor = assignor
        self._of: Any = None
        self._sets: tuple[frozenset[Any], frozenset[Any]] = (frozenset(), frozenset())

    def current(self) -> tuple[frozenset[Any], frozenset[Any]]:
        """(actives, standbys); raises before the first assignment, as faust does."""
        assignment = self.assignor._assignment
        if assignment is not self._of:
            actives = frozenset(self.assignor.assigned_actives())
            standbys = frozenset(self.assignor.assigned_standbys())
            self._of, self._sets = assignment, (actives, standbys)
        return self._sets


class FaustMembership:
    """The query layer's :class:`~tables.membership.Membership` over a faust app."""

    def __init__(self, app: Any, *, bootstrap: str, rebalances: RebalanceLog) -> None:
        self.app = app
        self.bootstrap = bootstrap
        #: a faust sensor the composition root added before the worker started
        self._rebalances = rebalances
        self._assigned: AssignedSets | None = None
        #: the group's metadata :meth:`hosts` last read, and what it made of it
        self._hosts_of: Any = None
        self._hosts: Mapping[str, Mapping[str, Sequence[int]]] = {}

    @property
    def app_id(self) -> str:
        return str(self.app.conf.id)

    @property
    def canonical_url(self) -> str:
        return str(self.app.conf.canonical_url)

    @property
    def rebalancing(self) -> bool:
        return bool(self.app.rebalancing)

    @property
    def generation(self) -> int | None:
        found = getattr(self.app, "consumer_generation_id", None)
        return found if isinstance(found, int) else None

    def assignment(self) -> Assignment | None:
        try:
            if self._assigned is None:
                self._assigned = AssignedSets(self.app.assignor)
            actives, standbys = self._assigned.current()
        except Exception:  # no assignment before the first rebalance
            return None
        return Assignment(actives, standbys)

    def hosts(self) -> Mapping[str, Mapping[str, Sequence[int]]]:
        try:
            metadata = self.app.router.tables_metadata()
        except Exception:  # before the first assignment
            return {}
        # faust replaces the metadata at each assignment: the same object, the same hosts.
        if metadata is not self._hosts_of or metadata is None:
            self._hosts = {str(url): dict(topics) for url, topics in (metadata or {}).items()}
            self._hosts_of = metadata
        return self._hosts

    def highwater(self, tp: TP) -> int | None:
        try:
            value = self.app.consumer.highwater(faust_tuples.TP(*tp))
        except Exception:  # not fetched by this consumer (yet)
            return None
        return None if value is None or value < 0 else int(value)

    def restore_highwater(self, tp: TP) -> int | None:
        recovery = self.app.tables.recovery
        ftp = faust_tuples.TP(*tp)
        value = None
        if ftp in recovery.active_tps:
            value = recovery.active_highwaters.get(ftp)
        elif ftp in recovery.standby_tps:
            value = recovery.standby_highwaters.get(ftp)
        # faust's recovery keeps the last offset (highwater - 1) in these counters
        return None if value is None else int(value) + 1

    def restore_progress(self) -> dict[str, Any]:
        return recovery_progress(self.app)

    def restore_remaining(self) -> Mapping[TP, int]:
        return restore_remaining(self.app)

    def restore_stats(self) -> RestoreStats | None:
        recovery = self.app.tables.recovery
        stats = getattr(recovery, "stats", None)
        return stats if isinstance(stats, RestoreStats) else None

    def broker_connected(self) -> bool | None:
        try:
            return broker_connected(self.app)
        except Exception:  # the consumer has not been created yet
            return None

    def on_revoked(self, receiver: Callable[[], Awaitable[None]]) -> None:
        async def on_partitions_revoked(sender: Any, *args: Any, **kwargs: Any) -> None:
            await receiver()

        self.app.on_partitions_revoked.connect(on_partitions_revoked, weak=False)

    @property
    def rebalances(self) -> RebalanceLog:
        return self._rebalances

    async def remove_static_members(self, instance_ids: Sequence[str]) -> dict[str, str]:
        return await remove_static_members(self.bootstrap, self.app_id, instance_ids)


def fetcher_of(app: faust.App) -> Any:
    """The Fetcher service an App runs."""
    return app._fetcher


def internal_channels(app: faust.App) -> list[Any]:
    """faust's own topics: every table's changelog, and the leader assignor's topic."""
    channels: list[Any] = [table.changelog_topic for table in app.tables.values()]
    leader: Any = app._leader_assignor
    channels.append(leader._leader_topic)
    return channels


# -- removing a static member on its behalf (KIP-345) -------------------------------------


class _LeaveGroupResponseV3(Response):  # type: ignore[misc]
    API_KEY = 13
    API_VERSION = 3
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        ("error_code", Int16),
        (
            "members",
            Array(
                ("member_id", String("utf-8")),
                ("group_instance_id", String("utf-8")),
                ("error_code", Int16),
            ),
        ),
    )


class _LeaveGroupRequestV3(RequestStruct):  # type: ignore[misc]
    API_KEY = 13
    API_VERSION = 3
    RESPONSE_TYPE = _LeaveGroupResponseV3
    SCHEMA = Schema(
        ("group_id", String("utf-8")),
        ("members", Array(("member_id", String("utf-8")), ("group_instance_id", String("utf-8")))),
    )


class _RemoveStaticMembers(Request[_LeaveGroupRequestV3]):  # type: ignore[misc]
    """LeaveGroup v3 naming members by their ``group.instance.id`` (aiokafka sends v0-v1)."""

    API_KEY = 13

    def __init__(self, group: str, instance_ids: Sequence[str]) -> None:
        self.group = group
        self.instance_ids = list(instance_ids)

    def build(self, request_struct_class: type[_LeaveGroupRequestV3]) -> _LeaveGroupRequestV3:
        return request_struct_class(self.group, [("", i) for i in self.instance_ids])


def leave_at_close(consumer: AIOKafkaConsumer) -> None:
    """Make a static member's consumer leave its group when it closes.

    aiokafka's coordinator sends no LeaveGroup for a static member (KIP-345: its
    partitions wait for it to come back); closed once every other coordinator task has
    ended (the last commit included), this one sends LeaveGroup v3 naming the member's
    instance id on the coordinator's own connection. A failure is logged as a warning:
    the member is then removed by its peers' probes or when its session expires."""
    coordinator: Any = getattr(consumer, "_coordinator", None)
    if coordinator is None or coordinator._group_instance_id is None:
        return
    coordinator._maybe_leave_group = functools.partial(_leave_as_static_member, coordinator)


#: The longest the worker's stop waits for its early leave of the group.
LEAVE_WAIT_S = 5.0


async def leave_group_now(app: Any) -> None:
    """Leave the group now, as the consumer's close would (see :func:`leave_at_close`),
    when the settings ask a stopping worker to leave: the coordinator closes on the
    consumer's thread, sends LeaveGroup, and neither heartbeats nor joins again. The
    consumer's own close later finds it closed. A failure is logged: the leave then
    happens at that close, as before."""
    settings = getattr(app, "settings", None)
    if not getattr(settings, "leave_group_on_stop", False):
        return
    consumer = aiokafka_consumer(app)
    coordinator: Any = getattr(consumer, "_coordinator", None)
    if consumer is None or coordinator is None:
        return
    leave_at_close(consumer)
    try:
        await asyncio.wait_for(_in_thread(app, coordinator.close), LEAVE_WAIT_S)
    except Exception as exc:
        logger.warning("leaving the group at the stop failed (%r): it leaves at the close", exc)


async def _leave_as_static_member(coordinator: Any) -> None:
    instance_id = coordinator._group_instance_id
    node = coordinator.coordinator_id
    if coordinator.generation > 0 and node is not None:
        request = _RemoveStaticMembers(coordinator.group_id, [instance_id])
        try:
            response: Any = await coordinator._client.send(
                node, request, group=ConnectionGroup.COORDINATION
            )
        except KafkaError as error:
            logger.warning("leaving group %s failed (%r)", coordinator.group_id, error)
        else:
            outcome = _removals(response, [instance_id])[instance_id]
            if outcome == "removed":
                logger.info("left group %s as %s", coordinator.group_id, instance_id)
            else:
                logger.warning("leaving group %s refused: %s", coordinator.group_id, outcome)
    coordinator.reset_generation()


async def remove_static_members(
    bootstrap: str, group: str, instance_ids: Sequence[str]
) -> dict[str, str]:
    """Remove static members from ``group`` on their behalf, as Kafka's admin API does
    (KIP-345): the group rebalances at once instead of waiting for their sessions to
    expire. Returns each instance id's outcome: ``removed``, or the broker's error."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        coordinator = await admin.find_coordinator(group)
        request = _RemoveStaticMembers(group, instance_ids)
        response: Any = await admin._send_request_to_node(coordinator, request)
    finally:
        await admin.close()
    return _removals(response, instance_ids)


def _removals(response: Any, instance_ids: Sequence[str]) -> dict[str, str]:
    """Each instance id's outcome in a LeaveGroup v3 response: ``removed``, or the
    broker's error."""
    if response.error_code:
        return dict.fromkeys(instance_ids, for_code(response.error_code).__name__)
    return {
        instance_id: "removed" if code == 0 else for_code(code).__name__
        for _member_id, instance_id, code in response.members
    }


# -- the fetch loop ----------------------------------------------------------------------


class EngineFetcher(Fetcher):
    """faust's Fetcher with the engine's loop: whole fetches of the source topics go to
    the engine; changelog records go on to faust's recovery and standbys."""

    @Service.task
    async def _fetcher(self) -> None:
        try:
            await _drain(self.app, self)
        finally:
            self.set_shutdown()


#: While changelog records wait for faust's recovery, the loop polls the source
#: partitions alone this often (seconds), and hands the waiting records on in between.
BACKLOG_POLL_S = 0.05
#: The longest the loop hands changelog records on in one round while sources may wait.
BACKLOG_SLICE_S = 0.05


class ChangelogBacklog:
    """Changelog records fetched but not yet handed to faust's recovery.

    faust applies standby and restored records one at a time from a bounded queue; handed
    on in the fetch loop, a standby catching up (a new member's copies, hundreds of
    thousands of records) would hold back the source partitions until it is done. So
    they are handed on only while the queue has room and faust's flow is active, for at
    most :data:`BACKLOG_SLICE_S` a round, in their order; meanwhile the loop fetches the
    source partitions alone, and the changelog partitions wait in the consumer's
    fetcher (one fetch each), so nothing grows without bound.
    """

    def __init__(self, app: Any) -> None:
        self.app = app
        self.pending: deque[tuple[Any, Any, FetchMark | None]] = deque()

    def __bool__(self) -> bool:
        return bool(self.pending)

    def add(self, tp: Any, batch: Sequence[Any], mark: FetchMark | None) -> None:
        self.pending.extend((tp, record, mark) for record in batch)

    async def feed(self) -> None:
        """Hand on what faust's queue can take now, within the slice."""
        app, consumer = self.app, self.app.consumer
        queue = app.tables.changelog_queue
        deadline = time.monotonic() + BACKLOG_SLICE_S
        while self.pending and not queue.full() and app.flow_control.is_active():
            tp, record, mark = self.pending.popleft()
            message = consumer._to_message(tp, record)
            message.fetched_at = mark  # checked when recovery takes it: tracked_only
            await consumer.callback(message)
            if time.monotonic() > deadline:
                break


async def _sources_only(consumer: Any, topics: Collection[str]) -> Any:
    """A fetch of the source partitions alone (faust's changelog partitions stay in the
    fetcher's buffer), waiting at most :data:`BACKLOG_POLL_S`."""
    wanted = {tp for tp in consumer._get_active_partitions() if tp.topic in topics}
    if not wanted:
        await asyncio.sleep(BACKLOG_POLL_S)
        return {}
    return await consumer._getmany(active_partitions=wanted, timeout=BACKLOG_POLL_S)


async def _next_records(consumer: Any, wait_s: float) -> Any:
    """faust's ``Consumer._wait_next_records``: the next fetch of the active partitions,
    once the flow runs, waiting at most ``wait_s``. With no active partition (the flow
    resumed, the partitions not yet), faust sleeps a whole second; this looks again after
    :data:`BACKLOG_POLL_S`, so that a rebalance's partitions are fetched as soon as they
    resume."""
    if not consumer.flow_active:
        await consumer.wait(consumer.can_resume_flow)
    consumer.not_waiting_next_records.set()
    active = consumer._get_active_partitions()
    if not active:
        await asyncio.sleep(BACKLOG_POLL_S)
        return {}
    return await consumer._getmany(active_partitions=active, timeout=wait_s)


def assignment_holds(app: Any, generation: int | None) -> bool:
    """Whether the group's assignment of ``generation`` still holds: no rebalance since."""
    return not app.rebalancing and app.consumer_generation_id == generation


async def _drain(app: Any, fetcher: Service) -> None:
    consumer = app.consumer
    engine: Engine = app.engine
    backlog = ChangelogBacklog(app)
    try:
        while not (consumer.should_stop or fetcher.should_stop):
            generation = app.consumer_generation_id
            try:
                if backlog and consumer.flow_active:
                    records = await _sources_only(consumer, engine.topics)
                else:
                    records = await _next_records(consumer, 1.0)
            except ConsumerStoppedError:
                return
            await engine.tick()
            if consumer.should_stop:
                continue
            if not records:
                await backlog.feed()
                continue
            sources = {tp: batch for tp, batch in records.items() if tp.topic in engine.topics}
            if sources:
                # Fetched during a rebalance (faust resumes the source partitions before
                # it ends it) or before one: the engine seeks them back. A partition with
                # no committed offset keeps its position through faust's seek to the
                # committed offsets, so dropped records would not come again.
                settled = assignment_holds(app, generation)
                positions = {}
                for tp in consumer.assignment():
                    if tp.topic in engine.topics:
                        position = _position(app, tp)
                        if position is not None:
                            positions[tp] = position
                starts = consumer._thread.fetched_starts
                await engine.offer(sources, positions, settled=settled, starts=starts)
            # After the sources, and never holding them back: faust hands changelog
            # records to recovery and the standbys one at a time.
            marks = consumer._thread.fetched_marks
            # TrackedRecovery's (faust's own recovery has none: every record queues)
            write_standby = getattr(app.tables.recovery, "write_standby", None)
            for tp, batch in records.items():
                if tp.topic in engine.topics or not batch:
                    continue
                if write_standby is None or not write_standby(tp, batch, marks.get(tp)):
                    backlog.add(tp, batch, marks.get(tp))
            await backlog.feed()
    except Exception as exc:
        logger.exception("the engine's fetch loop failed; the worker stops")
        await app.crash(exc)


# -- the engine's view of the group --------------------------------------------------------


class FaustConnector:
    """The engine's :class:`~tables.engine.Connector` over a faust app."""

    def __init__(self, app: Any, *, bootstrap: str, prepare: Any = None) -> None:
        self.app = app
        self.bootstrap = bootstrap
        self._prepare = prepare
        self._changelogs: list[str] = []
        self._not_copartitioned: set[int] = set()
        self._shared = SharedProducer(bootstrap)

    def watch_tables(self, changelog_topics: Sequence[str]) -> None:
        self._changelogs = list(changelog_topics)

    def ready(self, partition: int) -> bool:
        app = self.app
        recovery = getattr(app.tables, "recovery", None)
        if app.rebalancing or recovery is None or not recovery.completed.is_set():
            return False
        try:
            actives = app.assignor.assigned_actives()
        except Exception:  # no assignment yet
            return False
        missing = [t for t in self._changelogs if TP(t, partition) not in actives]
        if missing:
            if partition in self._not_copartitioned:
                return False  # said once: its records are fetched again every cycle
            self._not_copartitioned.add(partition)
            logger.error(
                "partition %d of the source topics is assigned here but not of the tables "
                "%s: the topics are not co-partitioned",
                partition,
                missing,
            )
            return False
        return True

    def assigned(self, partition: int, topics: frozenset[str]) -> list[TP]:
        return [
            TP(tp.topic, tp.partition)
            for tp in self.app.consumer.assignment()
            if tp.partition == partition and tp.topic in topics
        ]

    def producer(self, partition: int, *, transactional: bool) -> Producer:
        if transactional:
            return TransactionalProducer(
                self.bootstrap, f"{self.app.conf.id}-task-{partition}", self.app.conf.id
            )
        return self._shared.view()

    async def committed(self, tps: Sequence[TP]) -> dict[TP, int | None]:
        consumer = aiokafka_consumer(self.app)

        async def read() -> dict[TP, int | None]:
            assert consumer is not None
            # One request for all of them (AIOKafkaConsumer.committed asks one partition
            # at a time): the tasks a rebalance brings read theirs at once.
            found = await consumer._coordinator.fetch_committed_offsets(
                [KafkaTP(*tp) for tp in tps]
            )
            offsets: dict[TP, int | None] = {}
            for tp in tps:
                meta = found.get(KafkaTP(*tp))
                offsets[tp] = None if meta is None or meta.offset < 0 else meta.offset
            return offsets

        found: dict[TP, int | None] = await _in_thread(self.app, read)
        return found

    async def seek(self, offsets: Mapping[TP, int | None]) -> None:
        consumer = aiokafka_consumer(self.app)

        async def seek() -> None:
            assert consumer is not None
            # A partition revoked meanwhile is left to its next owner, who fetches it
            # from the committed offset.
            assigned = consumer.assignment()
            wanted = {KafkaTP(*tp): offset for tp, offset in offsets.items()}
            wanted = {tp: offset for tp, offset in wanted.items() if tp in assigned}
            # A partition with nothing committed starts at its log start, sought to as an
            # offset: a pending reset would leave the partition without a position.
            fresh = [tp for tp, offset in wanted.items() if offset is None]
            starts = await consumer.beginning_offsets(fresh) if fresh else {}
            thread = getattr(self.app.consumer, "_thread", None)
            for tp, offset in wanted.items():
                consumer.seek(tp, starts[tp] if offset is None else offset)
                if thread is not None:
                    thread.seeks[tp] += 1  # a fetch under way no longer says where it began

        await _in_thread(self.app, seek)

    async def commit(self, offsets: Mapping[TP, int]) -> None:
        consumer = aiokafka_consumer(self.app)

        async def commit() -> None:
            assert consumer is not None
            await consumer.commit({KafkaTP(*tp): offset for tp, offset in offsets.items()})

        try:
            await _in_thread(self.app, commit)
        except (CommitFailedError, IllegalStateError) as exc:
            raise CommitRefused(repr(exc)) from exc

    async def prepare(self) -> None:
        if self._prepare is not None:
            await self._prepare()

    def pause(self, tps: Sequence[TP]) -> None:
        # faust's own pause: the consumer still fetches the partitions (a seek resets
        # what it holds of them) but hands out none of their records.
        self.app.consumer.pause_partitions([faust_tuples.TP(*tp) for tp in tps])

    def resume(self, tps: Sequence[TP]) -> None:
        # faust adds these to its active partitions as they are, and asserts later that
        # they are its own TP type.
        self.app.consumer.resume_partitions([faust_tuples.TP(*tp) for tp in tps])

    async def limits(self, topics: Sequence[str]) -> dict[str, TopicLimits]:
        found = await topic_configs(self.bootstrap, list(topics))
        return {topic: topic_limits(config, {}) for topic, config in found.items()}

    async def close(self) -> None:
        await self._shared.stop()


class EngineService(Service):
    """Closes the engine's tasks and producers at the worker's stop."""

    def __init__(self, engine: Engine, **kwargs: Any) -> None:
        self.engine = engine
        super().__init__(**kwargs)

    async def on_stop(self) -> None:
        await self.engine.close()


class StandbyFlusher(Service):
    """Writes the updates faust buffers for standby partitions every ``interval`` seconds.

    faust buffers 1,000 standby updates per partition before it writes them: without
    this a standby could serve minutes-old values. (A service of its own rather than
    ``app.timer``, which walks every imported module when it is declared: 25 ms of every
    start-up on an idle machine.)
    """

    def __init__(self, app: Any, engine: Engine, interval: float, **kwargs: Any) -> None:
        self.app = app
        self.engine = engine
        self.interval = interval
        super().__init__(**kwargs)

    @Service.task
    async def _flush_periodically(self) -> None:
        async for _ in self.itertimer(self.interval, name="flush_standby_buffers"):
            self.flush()

    def flush(self) -> None:
        recovery: Any = getattr(self.app.tables, "recovery", None)
        if recovery is None or self.engine.failure is not None:
            return
        try:
            recovery.flush_buffers()
        except Exception as exc:  # a standby's store failed (a full disk, say)
            self.engine.fail(f"a standby's store failed: {exc!r}")


async def on_partitions_revoked(engine: Engine) -> None:
    """Receiver of ``app.on_partitions_revoked``: the cycle in flight commits first; the
    tasks stay for the partitions that come back (:func:`on_partitions_assigned`)."""
    await engine.suspend()


async def on_partitions_assigned(engine: Engine, assigned: Iterable[Any]) -> None:
    """Receiver of ``app.on_partitions_assigned``: the tasks of the partitions assigned
    elsewhere close; the others go on as they were."""
    await engine.keep({tp.partition for tp in assigned if tp.topic in engine.topics})


# -- tables ---------------------------------------------------------------------------


class PointLookupOptions(RocksDBOptions):
    """faust's RocksDB options, with the memtables filtered by whole key as well.

    Pipelines look keys up one at a time, and many of those keys are new (a stream
    join's buffer is asked for every record's join key): a bloom filter over the
    memtables answers such a miss without walking their skip lists. The table files'
    own filters are sized by ``bloom_filter_size`` (:func:`tables.definitions.declare_tables`).
    """

    #: The memtable filter's size, as a share of the write buffer.
    MEMTABLE_BLOOM_RATIO = 0.1

    def as_options(self) -> Any:
        options = super().as_options()
        if self.use_rocksdict:
            options.set_memtable_prefix_bloom_ratio(self.MEMTABLE_BLOOM_RATIO)
            options.set_memtable_whole_key_filtering(True)
        return options


class EngineStore(RocksStore):
    """faust's RocksDB store that closes the databases a rebalance drops once the
    worker is ready again, and takes one back unclosed if the partition returns.

    faust drops a revoked partition's database and collects garbage, for each table at
    every rebalance, so that the database is destroyed and its lock released before the
    partition is opened again. That collection, and the closes, ran in the middle of the
    rebalance, while no partition is processed: 0.5-0.8 s of every rebalance that took
    standbys away in the chaos scale scenario's logs. Here a dropped database is
    *parked*: out of faust's ``_dbs`` (so nothing reads or writes it as held), closed by
    :meth:`close_parked` once the recovery is complete, and handed back as it is when
    its partition is opened again meanwhile.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.rocksdb_options = PointLookupOptions(
            **(self.options or {}), use_rocksdict=self.use_rocksdict
        )
        self._parked: dict[int, Any] = {}

    def revoke_partitions(self, table: Any, tps: set[Any]) -> None:
        topics = table.changelog_topic.topics
        for tp in tps:
            if tp.topic in topics:
                db = self._dbs.pop(tp.partition, None)
                if db is not None:
                    self._parked[tp.partition] = db

    def _open_for_partition(self, partition: int) -> Any:
        parked = self._parked.pop(partition, None)
        if parked is not None:
            return parked
        return super()._open_for_partition(partition)

    def take_parked(self) -> list[Any]:
        """The parked databases, no longer to be handed back."""
        parked, self._parked = list(self._parked.values()), {}
        return parked

    async def stop(self) -> None:
        """Drop every database (each closes as its last reference goes) without faust's
        garbage collection, which the stop of each table ran in turn: 0.45 s of a
        SIGTERM's way to the group's leave, with six tables, in the chaos scale
        scenario's logs."""
        self.logger.info("Closing rocksdb on stop")
        self._parked.clear()
        self._dbs.clear()


class EngineTable(faust.Table[Any, Any]):
    """faust's Table whose recovery and standbys never write a changelog record that
    the partition's database already holds, kept in an :class:`EngineStore`.

    faust buffers the changelog records it restores or copies to a standby, and writes
    a buffer later: when it is full, on a timer, at a rebalance. Meanwhile the
    partition's database may have moved past them: the bulk restore writes the
    partition's tail, or the engine, now active here, writes its own cycles. Written
    then, the older records would put back values and keys the database has already
    replaced or deleted, and take its persisted offset back. So a record at or below
    the offset the database holds is not written again.
    """

    def _new_store_by_url(self, url: Any) -> Any:
        factory = faust_stores.by_url(url)
        if factory is RocksStore:
            factory = EngineStore
        return factory(
            url,
            self.app,
            self,
            table_name=self.name,
            key_type=self.key_type,
            key_serializer=self.key_serializer,
            value_serializer=self.value_serializer,
            value_type=self.value_type,
            loop=self.loop,
            options=self.options,
        )

    def apply_changelog_batch(self, batch: Iterable[Any]) -> None:
        fresh = newer_than_stored(self.data, batch)
        if fresh:
            super().apply_changelog_batch(fresh)


def newer_than_stored(store: Any, batch: Iterable[Any]) -> list[Any]:
    """The changelog events of ``batch`` past the offset their partition's database
    holds (faust's ``persisted_offset``), in order."""
    held: dict[Any, int] = {}
    fresh = []
    for event in batch:
        tp = event.message.tp
        if tp not in held:
            offset = store.persisted_offset(tp)
            held[tp] = -1 if offset is None else int(offset)
        if event.message.offset > held[tp]:
            fresh.append(event)
    return fresh


class _RocksPartition:
    """One partition database of a faust RocksDB table, internal keys hidden."""

    def __init__(self, db: Any, hidden: tuple[bytes, ...]) -> None:
        self.db = db
        self.hidden = hidden

    def get(self, key: bytes) -> bytes | None:
        if key in self.hidden:
            return None
        value: bytes | None = self.db.get(key)
        return value

    def items(self, start: bytes) -> Iterator[tuple[bytes, bytes]]:
        for key, value in self.db.items(from_key=start):
            if key not in self.hidden:
                yield key, value


class FaustTableStore:
    """A faust table's RocksDB store, as the engine writes it and the query layer reads
    it: the one place that opens its partition databases and hides their internal keys
    (faust's persisted offset and the :data:`~core.topics.POSITION_KEY`)."""

    def __init__(self, table: Any) -> None:
        self.table = table
        self.name: str = table.name
        self.changelog_topic: str = table.changelog_topic.get_topic_name()
        self._store: Any = table.data
        self._hidden = (self._store.offset_key, POSITION_KEY)

    def partition(self, partition: int) -> _RocksPartition:
        return _RocksPartition(self._store._db_for_partition(partition), self._hidden)

    def apply(
        self, partition: int, changes: Mapping[bytes, bytes | None], changelog_offset: int | None
    ) -> None:
        write_changes(self._store, partition, changes.items(), changelog_offset)

    def position(self, partition: int) -> bytes | None:
        found: bytes | None = self._store._db_for_partition(partition).get(POSITION_KEY)
        return found

    def held(self, partition: int) -> bool:
        return partition in self._store._dbs

    def persisted_offset(self, partition: int) -> int | None:
        """The last changelog offset the partition's database holds."""
        value = self._store.persisted_offset(faust_tuples.TP(self.changelog_topic, partition))
        return None if value is None else int(value)


def write_changes(
    store: Any,
    partition: int,
    changes: Iterable[tuple[bytes, bytes | None]],
    changelog_offset: int | None,
) -> None:
    """Write ``changes`` (None deletes) and faust's persisted changelog offset into one
    partition database of a faust RocksDB ``store``, as one atomic write batch."""
    batch = WriteBatch(raw_mode=True)
    for key, value in changes:
        if value is None:
            batch.delete(key)
        else:
            batch.put(key, value)
    if changelog_offset is not None:
        batch.put(store.offset_key, str(changelog_offset).encode())
    store._db_for_partition(partition).write(batch)


def persisted_offset(table: Any, tp: Any) -> int | None:
    """The last changelog offset a partition database holds."""
    value = table.data.persisted_offset(tp)
    return None if value is None else int(value)


# -- recovery ---------------------------------------------------------------------------


def write_run(store: Any, partition: int, records: Iterable[Any], last_offset: int) -> int:
    """Write one fetched run of changelog records and the persisted offset atomically.

    Keys and values are the changelog's bytes, as faust's ``apply_changelog_batch``
    writes them; a ``None`` value (tombstone) deletes. Returns the number of records.
    """
    changes = [(record.key, record.value) for record in records if record.key is not None]
    write_changes(store, partition, changes, last_offset)
    return len(changes)


class TrackedRecovery(Recovery):
    """faust's Recovery with a bulk path for long tails, timing and counting restores.

    faust restores the active partitions of every table after each rebalance, one record
    at a time through its changelog queue (a few thousand records per second). This
    first reads the changelog partitions that are far behind with a consumer of its own,
    in large fetches, and writes each fetched run of a partition as one RocksDB write
    batch that also carries the partition's persisted changelog offset (so a kill -9 in
    the middle leaves a consistent prefix). faust's own recovery then starts from that
    offset and only reads what is left, usually nothing. The bulk read stops at the
    highwater faust measured for the same recovery; it is abandoned (faust's path takes
    over from the last written batch) on a new rebalance, on stop, or when its time
    budget runs out. Every partition that is behind is read this way, whatever the
    worker's guarantee: a changelog written under exactly_once ends with a commit marker
    that is never delivered as a record, and faust's own path would wait for it.
    """

    #: Records per fetch of the bulk consumer.
    bulk_max_records = 20_000
    #: Records per fetch of the bulk consumer once the worker is ready (its standby
    #: copies): the event loop, which serves the active tasks and the reads meanwhile,
    #: gets a turn after each fetch's writes.
    bulk_standby_max_records = 4_000
    #: Share of ``broker_request_timeout`` (faust's limit on this step) the bulk read may use.
    bulk_budget_share = 0.6
    #: How long one fetch of the bulk consumer waits for records, in ms. A partition whose
    #: tail is a transaction marker (every changelog written under exactly_once) yields no
    #: record: only its position moves past the marker, which the loop checks after each
    #: wait. A long wait would hold every restore up by that much.
    bulk_poll_ms = 50

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stats = RestoreStats()
        self._records_now = 0
        #: (generation, records, start) of this round's bulk read: faust calls
        #: ``_set_recovery_started`` again after it, which must not reset them.
        self._bulk_carry: tuple[int, int, float | None] | None = None
        self._ends: AIOKafkaConsumer | None = None
        self._ends_lock = asyncio.Lock()
        #: changelog records of partitions no longer restored here, skipped (tracked_only)
        self.untracked_records = 0
        #: changelog records fetched before their partition was sought again, skipped
        self.stale_records = 0
        #: the standby partitions of the current assignment, started after "Worker ready"
        self._deferred_standbys: list[tuple[Any, Any]] = []
        #: what the standby start waits for once the worker is ready, at most
        #: ``standbys_wait_s`` (the composition root: the HTTP API serving)
        self.standbys_after: Callable[[], Awaitable[Any]] | None = None
        #: set once the first recovery has completed ("Worker ready")
        self.recovered = asyncio.Event()
        #: the standby partitions started for the assignment of ``_direct_generation``
        #: whose fetched changelog records go straight to their databases
        #: (:meth:`write_standby`), with their tables
        self._direct: dict[Any, Any] = {}
        self._direct_generation: int | None = None
        #: what the standby start waits for after a recovery that gave this worker active
        #: partitions, at most ``actives_first_wait_s`` (the composition root: the
        #: engine's next cycle)
        self.actives_first: Callable[[], Awaitable[Any]] | None = None
        #: a count that stays while the active partitions' stores hold every record their
        #: writer had Kafka commit, with only a transaction marker after it in each
        #: changelog, else None (the composition root: the engine's ``stores_epoch``)
        self.stores_epoch: Callable[[], int | None] | None = None
        #: the generation of the last recovery that completed, its active partitions,
        #: and ``stores_epoch`` then
        self._ready: tuple[int, frozenset[Any], int | None] | None = None

    async def on_start(self) -> None:
        await super().on_start()
        # Connected while the group forms, not after the assignment, when every moment
        # counts towards the restart (the recovery's first request needs it).
        self.add_future(self._warm_up())

    async def _warm_up(self) -> None:
        with contextlib.suppress(Exception):  # not reachable yet: the recovery tries again
            await self._ends_consumer()

    # -- standby partitions start after the worker is ready ----------------------------------
    #
    # faust reads each standby partition's persisted offset when the assignment comes,
    # which opens its RocksDB database (about 12 ms of CPU after a kill -9, holding the
    # GIL: rocksdict opens in the calling thread), then seeks the standbys before it says
    # "Worker ready". A standby serves no write and no read that an active copy can serve,
    # so a restart or a rebalance need not wait for them: faust's recovery sees only the
    # actives, and the standbys are added, sought and resumed once the worker is ready and
    # (at a start) its HTTP API serves, whose import in a thread the opens would hold up.

    #: Longest wait for ``standbys_after`` before the standbys start anyway.
    standbys_wait_s = 10.0
    #: Longest wait for ``actives_first`` before the standbys start anyway. The standby
    #: start (the databases' opens, the copies' catch-up) shares the event loop and the
    #: GIL with the first cycle after a rebalance, which carries every record that
    #: arrived during it: that cycle's commit comes first.
    actives_first_wait_s = 2.0

    def add_standby(self, table: Any, tp: Any) -> None:
        self._deferred_standbys.append((table, tp))

    async def on_rebalance(
        self, assigned: Any, revoked: Any, newly_assigned: Any, generation_id: int = 0
    ) -> None:
        self._deferred_standbys = []
        self._direct = {}
        await super().on_rebalance(assigned, revoked, newly_assigned, generation_id)

    async def on_recovery_completed(self, generation_id: int = 0) -> None:
        await super().on_recovery_completed(generation_id)
        epoch = None if self.stores_epoch is None else self.stores_epoch()
        self._ready = (generation_id, frozenset(self.active_tps), epoch)
        self.recovered.set()
        self.add_future(self._close_parked())
        deferred, self._deferred_standbys = self._deferred_standbys, []
        if deferred and assignment_holds(self.app, generation_id):
            self.add_future(self._start_standbys(deferred, generation_id))

    async def _close_parked(self) -> None:
        """Close the databases the last rebalances dropped, one by one, in a thread
        (rocksdict flushes and waits for its background work there)."""
        for table in list(self.tables.values()):
            store = table.data
            if not isinstance(store, EngineStore):
                continue
            for db in store.take_parked():
                try:
                    await asyncio.to_thread(db.close)
                except Exception as exc:  # closed already, or its disk failed
                    logger.warning("closing a dropped database of %s: %r", table.name, exc)

    async def _start_standbys(self, deferred: list[tuple[Any, Any]], generation_id: int) -> None:
        """faust's standby start for the partitions of one assignment, after the worker
        is ready; given up when the group rebalances meanwhile (the next assignment
        starts its own)."""
        if self.standbys_after is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.standbys_after(), self.standbys_wait_s)
        if self.actives_first is not None and self.active_tps:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.actives_first(), self.actives_first_wait_s)
        started = time.monotonic()
        tps = set()
        for table, tp in deferred:
            if not assignment_holds(self.app, generation_id):
                return
            super().add_standby(table, tp)  # opens the partition's database
            tps.add(tp)
            await asyncio.sleep(0)  # reads and cycles go on between two databases
        consumer = self.app.consumer
        timeout = self.app.conf.broker_request_timeout
        offsets, highwaters = self.standby_offsets, self.standby_highwaters
        try:
            await self._wait(self._build_highwaters(consumer, tps, highwaters, "standby"), timeout)
            await self._wait(self._build_offsets(consumer, tps, offsets, "standby"), timeout)
            if not assignment_holds(self.app, generation_id):
                return
            await self._wait(self._seek_offsets(consumer, tps, offsets, "standby"), timeout)
        except (RebalanceAgain, ServiceStopped, IllegalStateError):
            # A rebalance began meanwhile (IllegalStateError: a partition was revoked
            # under the seek, as faust's own recovery expects): the next one starts anew.
            return
        if not assignment_holds(self.app, generation_id):
            return
        if self.app.conf.recovery_consistency_check:
            for tp in tps:
                offset, highwater = offsets[tp], highwaters.get(tp)
                if offset and highwater and offset > highwater:
                    await self.crash(
                        ConsistencyError(E_PERSISTED_OFFSET.format(tp, offset, highwater))
                    )
                    return
        self._direct = self._bulk_tables(tps)
        self._direct_generation = generation_id
        consumer.resume_partitions(tps)
        self.app.flow_control.resume()
        consumer.resume_flow()
        logger.info(
            "standby partitions started after the worker was ready: %d in %.2f s",
            len(tps),
            time.monotonic() - started,
        )

    # -- standby records written as fetched ------------------------------------------------
    #
    # faust applies a standby's changelog records one at a time through its changelog
    # queue: under load the copies fell 30,000-40,000 records behind, which a partition
    # moving to one restored before the worker was ready, every partition of the worker
    # waiting meanwhile. A standby of a RocksDB table started here writes each fetched run
    # as the bulk copy does instead: one write batch that carries the persisted offset.
    # None of its records goes through faust's queue, so that nothing applied there later
    # is left out as already held.

    def write_standby(self, tp: Any, records: Sequence[Any], mark: FetchMark | None) -> bool:
        """Write a fetched run of changelog records of a standby partition started here
        into its database; False when ``tp`` is not one (faust's queue takes them).
        Records fetched under an earlier assignment or before the partition was sought
        again are left out: the next assignment's copy reads them again from the
        database's offset."""
        table = self._direct.get(tp)
        if table is None:
            return False
        consumer: Any = self.app.consumer
        thread = consumer._thread
        if not assignment_holds(self.app, self._direct_generation) or mark != fetch_mark(
            thread, tp
        ):
            self.stale_records += len(records)
            return True
        engine: Any = getattr(self.app, "engine", None)
        if engine is not None and engine.failure is not None:
            return True  # the worker processes nothing more: its restart copies these
        seen = self.standby_offsets.get(tp)
        run = [r for r in records if seen is None or r.offset > seen]
        if run:
            last = run[-1].offset
            try:
                written = write_run(table.data, tp.partition, run, last)
            except Exception as exc:  # its disk is full or failed
                if engine is None:
                    raise
                # As a failed write of faust's own standby path does (StandbyFlusher).
                engine.fail(f"a standby's store failed: {exc!r}")
                return True
            self.stats.standby_records += written
            self.stats.standby_written_records += written
            self.standby_offsets[tp] = last
        return True

    def count(self, table_name: str, *, active: bool) -> None:
        """Called once per changelog record that recovery hands to a table."""
        if active:
            self._records_now += 1
            self.stats.records_by_table[table_name] += 1
        else:
            self.stats.standby_records += 1

    async def _build_offsets(self, consumer: Any, tps: Any, destination: Any, title: str) -> None:
        """faust's start offsets of a restore: the offset each partition database holds,
        or the log start when compaction or retention has removed what lies before.

        faust asks the group's consumer for the log starts, and that request queues behind
        the consumer's long-polling fetches on the same connection (a second here at
        every assignment); the recovery's own consumer answers at once.
        """
        if not tps:
            return
        starts = await self._own_offsets("log start", tps)
        if starts is None:  # the broker did not answer: faust's own way
            await super()._build_offsets(consumer, tps, destination, title)
        else:
            for tp in tps:
                start = starts.get(KafkaTP(tp.topic, tp.partition))
                earliest = None if start is None else start - 1
                held = destination[tp]
                if held is None:
                    destination[tp] = -1 if earliest is None else earliest
                elif earliest is not None:
                    destination[tp] = max(held, earliest)
            logger.info(
                "%s offsets at start of reading: %d changelog partitions, %d records held",
                title,
                len(tps),
                sum(max(0, v + 1) for tp, v in destination.items() if tp in tps),
            )
        # A partition far behind (an active restoring; a standby new here, or back after
        # a while) reads its tail in large fetches, not through faust's queue.
        active = title == "active"
        highwaters = self.active_highwaters if active else self.standby_highwaters
        await self._bulk_restore(tps, destination, highwaters, starts, active=active)

    async def _build_highwaters(
        self, consumer: Any, tps: Any, destination: Any, title: str
    ) -> None:
        """Highwaters from the broker's last stable offsets.

        faust reads them from the consumer's last fetch response, which knows nothing of
        a partition not fetched since it was assigned, and counts the commit markers
        in: restored, such a partition would wait for a record that never comes.
        """
        if not tps:
            await super()._build_highwaters(consumer, tps, destination, title)
            return
        ends = await self._own_offsets("last stable", tps)
        if ends is None:  # the broker did not answer: faust's own figures
            await super()._build_highwaters(consumer, tps, destination, title)
            return
        destination.clear()
        for tp in tps:
            end = ends.get(KafkaTP(tp.topic, tp.partition))
            destination[tp] = end - 1 if end else -1
        logger.info(
            "%s highwaters (last stable offsets - 1) of %d changelog partitions: %d records",
            title,
            len(tps),
            sum(v + 1 for v in destination.values()),
        )

    async def _own_offsets(self, which: str, tps: Any) -> dict[KafkaTP, int] | None:
        """The ``which`` ("log start" or "last stable") offsets of ``tps`` from the
        recovery's own consumer; None, with a warning, when the broker does not answer."""
        try:
            helper = await self._ends_consumer()
            wanted = [KafkaTP(tp.topic, tp.partition) for tp in tps]
            if which == "log start":
                found: dict[KafkaTP, int] = await helper.beginning_offsets(wanted)
            else:
                found = await helper.end_offsets(wanted)
        except Exception as exc:
            logger.warning("%s offsets unavailable (%r): faust's own way", which, exc)
            return None
        return found

    async def _ends_consumer(self) -> AIOKafkaConsumer:
        """A ``read_committed`` consumer of the recovery's own, for start and end offsets.

        It retries a partition whose metadata it lacks every 10 ms, not aiokafka's 100 ms:
        its first request names topics it has not seen yet.
        """
        async with self._ends_lock:
            if self._ends is None:
                consumer = self._reader(retry_backoff_ms=10)
                await consumer.start()
                self._ends = consumer
            return self._ends

    async def on_stop(self) -> None:
        await super().on_stop()
        if self._ends is not None:
            with contextlib.suppress(Exception):
                await self._ends.stop()
            self._ends = None

    def _reader(self, **options: Any) -> AIOKafkaConsumer:
        """A consumer outside the group that reads committed records only."""
        return AIOKafkaConsumer(
            bootstrap_servers=self._bootstrap(),
            group_id=None,
            enable_auto_commit=False,
            isolation_level="read_committed",
            **options,
        )

    def _bootstrap(self) -> str:
        settings = getattr(self.app, "settings", None)
        if settings is not None:
            return str(settings.bootstrap_servers)
        return ",".join(f"{u.host}:{u.port or 9092}" for u in self.app.conf.broker)

    def _bulk_tables(self, tps: Iterable[Any]) -> dict[Any, Any]:
        """The changelog partitions of ``tps`` whose table keeps its data in RocksDB."""
        tables: dict[Any, Any] = {}
        for tp in tps:
            table = self.tp_to_table.get(tp)
            store = getattr(table, "data", None)
            if (
                store is not None
                and hasattr(store, "_db_for_partition")
                and getattr(store, "use_rocksdict", False)
            ):
                tables[tp] = table
        return tables

    async def _bulk_restore(
        self,
        tps: Iterable[Any],
        offsets: MutableMapping[Any, Any],
        highwaters_of: Mapping[Any, Any],
        log_starts: Mapping[KafkaTP, int] | None,
        *,
        active: bool = True,
    ) -> None:
        """Read the tails of ``tps`` in bulk, up to ``highwaters_of``, from the offset each
        partition's database holds (or the log start, if later): ``offsets`` may be ahead
        of it by records faust has buffered but not written, which :class:`EngineTable`
        then leaves out, as the bulk read writes them first. ``active``: the partitions
        are the assignment's active ones (restored before the worker is ready), else its
        standbys (copied after)."""
        what = "bulk restore" if active else "bulk standby copy"
        tables = self._bulk_tables(tps)
        highwaters = {tp: highwaters_of.get(tp) for tp in tables}
        kept = self.kept_partitions() if active else frozenset()
        starts, skipped = {}, 0
        for tp, table in tables.items():
            held = persisted_offset(table, tp)
            start = None if log_starts is None else log_starts.get(KafkaTP(tp.topic, tp.partition))
            first = max(-1 if held is None else held, -1 if start is None else start - 1)
            end = highwaters[tp]
            if tp in kept and held is not None and end is not None and first < end:
                # Its store holds every record this worker wrote since it restored it:
                # only transaction markers follow. Recorded without a read.
                write_run(table.data, tp.partition, (), end)
                first = end
                skipped += 1
            starts[tp] = first
            offsets[tp] = first
        if skipped:
            logger.info("%s: %d kept partitions end in transaction markers only", what, skipped)
        plan = bulk_plan(starts, highwaters, 1)
        if not plan:
            return
        budget = float(self.app.conf.broker_request_timeout) * self.bulk_budget_share
        started = time.monotonic()
        consumer = self._reader(
            max_partition_fetch_bytes=16 * 1024 * 1024, fetch_max_bytes=64 * 1024 * 1024
        )
        read = 0
        most = self.bulk_max_records if active else self.bulk_standby_max_records
        try:
            await consumer.start()
            remaining = {
                KafkaTP(tp.topic, tp.partition): (tp, end) for tp, (_, end) in plan.items()
            }
            consumer.assign(list(remaining))
            for ktp, (tp, _) in remaining.items():
                consumer.seek(ktp, plan[tp][0])
            while remaining:
                if self.should_stop or self.signal_recovery_start.is_set():
                    logger.info("%s abandoned: rebalance or stop", what)
                    return
                if time.monotonic() - started > budget:
                    logger.info("%s stopped at its %.0f s budget", what, budget)
                    return
                fetched = await consumer.getmany(timeout_ms=self.bulk_poll_ms, max_records=most)
                for ktp, records in fetched.items():
                    entry = remaining.get(ktp)
                    if entry is None:
                        continue
                    tp, end = entry
                    run = [r for r in records if r.offset < end]
                    if run:
                        table = tables[tp]
                        n = write_run(table.data, tp.partition, run, run[-1].offset)
                        offsets[tp] = run[-1].offset
                        read += n
                        if active:
                            self._records_now += n
                            self.stats.records_by_table[table.name] += n
                        else:
                            self.stats.standby_records += n
                # Records the consumer holds already come back without a wait: without
                # this, the loop would run the whole read with no other task's turn.
                await asyncio.sleep(0)
                for ktp, (tp, end) in list(remaining.items()):
                    position = await consumer.position(ktp)
                    if position >= end:
                        # Only transaction markers (or nothing) may lie past the last
                        # record written: everything below ``end`` has been applied.
                        last = end - 1
                        if offsets.get(tp) != last:
                            write_run(tables[tp].data, tp.partition, (), last)
                            offsets[tp] = last
                        del remaining[ktp]
        finally:
            elapsed = time.monotonic() - started
            rate = read / elapsed if elapsed > 0 else 0.0
            logger.info(
                "%s: %d changelog records of %d partitions in %.3f s (%.0f records/s)",
                what,
                read,
                len(plan),
                elapsed,
                rate,
            )
            if active:
                self.stats.bulk_records += read
                self.stats.bulk_duration_s += elapsed
                self._bulk_carry = (self._generation_id, self._records_now, self.stats.started_at)
            with contextlib.suppress(Exception):
                await consumer.stop()

    def kept_partitions(self) -> frozenset[Any]:
        """The active partitions whose store holds their changelog up to a transaction
        marker at its end: those this worker held as active in the generation right
        before this one, once its recovery had completed, while ``stores_epoch`` has not
        moved since. Under exactly_once only this worker wrote them meanwhile (a new
        owner's producer fences an old one's), each committed record into its store too."""
        ready = self._ready
        if ready is None or self.stores_epoch is None:
            return frozenset()
        generation, actives, epoch = ready
        if epoch is None or self.stores_epoch() != epoch or self._generation_id != generation + 1:
            return frozenset()
        return actives

    def _set_recovery_started(self) -> None:
        super()._set_recovery_started()
        carry, self._bulk_carry = self._bulk_carry, None
        self.stats.in_progress = True
        if carry is not None and carry[0] == self._generation_id:
            _, self._records_now, self.stats.started_at = carry
            return
        self._records_now = 0
        self.stats.started_at = time.monotonic()

    def _set_recovery_ended(self) -> None:
        super()._set_recovery_ended()
        if not self.stats.in_progress or self.stats.started_at is None:
            return
        elapsed = time.monotonic() - self.stats.started_at
        stats = self.stats
        stats.in_progress = False
        stats.restores += 1
        stats.last_duration_s = elapsed
        stats.last_records = self._records_now
        stats.total_records += self._records_now
        stats.total_duration_s += elapsed
        rate = self._records_now / elapsed if elapsed > 0 else 0.0
        logger.info(
            "restore %d done: %d changelog records in %.3f s (%.0f records/s) for %d "
            "partitions; skipped so far: %d records of partitions not restored here, %d "
            "fetched before a seek",
            stats.restores,
            self._records_now,
            elapsed,
            rate,
            len(self.active_tps),
            self.untracked_records,
            self.stale_records,
        )


class StreamstateTableManager(TableManager):
    """TableManager whose recovery is a :class:`TrackedRecovery`.

    faust's manager sleeps one second at start so that tables declared late can still
    register; every table here is declared when the app is created, so it starts at once.
    """

    async def on_start(self) -> None:
        if not self.should_stop:
            await self._update_channels()
            await self.recovery.start()

    @property
    def recovery(self) -> TrackedRecovery:
        if self._recovery is None:
            self._recovery = TrackedRecovery(self.app, self, beacon=self.beacon, loop=self.loop)
        return self._recovery  # type: ignore[return-value]

    @property
    def changelog_queue(self) -> Any:
        """The queue of changelog records for recovery, handing out only the records it
        may apply (see :func:`tracked_only`).

        Unlike faust's, it is not emptied when the flow resumes after a rebalance: the
        records fetched after the emptying, before the recovery seeks again, would then
        follow a gap, and applied they would make the recovery skip it. Records fetched
        before a seek are left out one by one instead, by their fetch mark.
        """
        if self._changelog_queue is None:
            queue = self.app.FlowControlQueue(
                maxsize=self.app.conf.stream_buffer_maxsize, clear_on_resume=False
            )
            consumer: Any = self.app.consumer
            tracked_only(queue, self.recovery, lambda tp: fetch_mark(consumer._thread, tp))
            self._changelog_queue = queue
        return self._changelog_queue


def tracked_only(
    queue: Any, recovery: Any, current_mark: Callable[[Any], FetchMark] | None = None
) -> None:
    """Make ``queue.get`` skip the changelog records that ``recovery`` must not apply:

    * records of partitions it tracks neither as active nor as standby (fetched before a
      rebalance took them away). faust's recovery loop only warns about such a record
      ("recovery unknown topic") and then applies it with the previous record's table
      and offsets: another table's partition gets its key and value.
    * records fetched before the recovery sought their partition again, or before it
      was assigned anew (their :func:`fetch_mark` is not the partition's
      ``current_mark``). The recovery reads them again from where it sought, which is
      what it has applied. Applied, an old record would move its count of records seen
      past the records between, and those would never be applied: the copy would miss
      them for good.
    """
    get = queue.get

    async def get_tracked() -> Any:
        while True:
            event = await get()
            message = event.message
            tp = message.tp
            if tp not in recovery.active_tps and tp not in recovery.standby_tps:
                recovery.untracked_records += 1
                logger.debug("changelog record of %s skipped: not restored here now", tp)
                continue
            fetched = getattr(message, "fetched_at", None)
            if current_mark is not None and fetched is not None and fetched != current_mark(tp):
                recovery.stale_records += 1
                continue
            return event

    queue.get = get_tracked


def restore_counter(app: faust.App, name: str) -> Any:
    """A table's ``on_changelog_event``: counts the records recovery applies."""

    async def on_changelog_event(event: Any) -> None:
        recovery = getattr(app.tables, "recovery", None)
        if isinstance(recovery, TrackedRecovery):
            recovery.count(name, active=event.message.tp in recovery.active_tps)

    return on_changelog_event


def recovery_progress(app: Any) -> dict[str, Any]:
    """Per active changelog partition: the offset restored so far and the target."""
    recovery = app.tables.recovery
    highwaters = recovery.active_highwaters
    offsets = recovery.active_offsets
    partitions = {}
    for tp in sorted(recovery.active_tps):
        target, done = highwaters.get(tp), offsets.get(tp)
        remaining = None if target is None or done is None else max(0, target - done)
        partitions[f"{tp.topic}:{tp.partition}"] = {
            "offset": done,
            "highwater": target,
            "remaining": remaining,
        }
    stats = getattr(recovery, "stats", None)
    return {
        "partitions": partitions,
        "remaining_total": sum(p["remaining"] or 0 for p in partitions.values()),
        "rebalancing": bool(app.rebalancing),
        "restore": stats.as_dict() if stats is not None else None,
    }


def restore_remaining(app: Any) -> Counter[Any]:
    recovery = app.tables.recovery
    remaining: Counter[Any] = recovery.active_remaining()
    return remaining
