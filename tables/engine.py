"""The engine every pipeline runs on, and the one owner of its commit cycle.

For each source partition number ``p`` assigned to this worker there is one task
(:class:`~tables.task.Task`). All source topics are co-partitioned, so task ``p`` reads
partition ``p`` of every source topic and owns partition ``p`` of every table. A task
builds what one cycle makes (its pipelines over the fetched records, on views of the
tables); the :class:`Engine` makes it take effect, and every rule of the cycle is here, in
:meth:`Engine.process` and the methods it calls, in this order:

1. **Apply.** The records not applied yet (:class:`~tables.task.Checkpoint`) go to the pipelines
   (:mod:`tables.pipeline`), whose writes stay on table views; a record whose processing
   raises is dead-lettered. Every output and changelog record is checked against its
   topic's rules; the input records whose effects would be refused are dead-lettered
   and the rest is built again without them (:mod:`tables.refusals`).
2. **Produce and wait.** The changelog records of every table write (each table
   partition's position among them), the outputs (position records for the repartition
   topics among them) and, under ``exactly_once``, the next source offsets go to Kafka
   as one transaction of the task's own producer (:meth:`Engine._produce`). Under
   ``at_least_once`` the outputs are acknowledged before any changelog record is sent.
3. **Store.** Only then are the writes applied to the local stores, one write batch per
   table partition with the changelog offset it reaches and the partition's position;
   then the listeners (the query layer's waits and change streams) hear of them.
4. **Commit.** Under ``at_least_once`` the consumer group commits the offsets of every
   task whose cycle got this far, once per engine cycle (:meth:`Engine._commit`); a
   commit the group refuses because it rebalanced is not a failure: the partitions'
   next owners apply those records again.

When it fails:

* Kafka refuses records for their own sake (too large, a timestamp out of range, no key
  for a compacted topic): the task learns which input records made them, its producer is
  replaced, and it tries again at once, up to :data:`MAX_ROUNDS` attempts
  (:meth:`Engine._run`). Under ``at_least_once`` the outputs Kafka took from a failed
  attempt are not sent again.
* Kafka fails the cycle for another reason (:class:`EngineFailure`): nothing of it takes
  effect; its task closes, its partitions pause and it is tried again from the committed
  offsets after a backoff (:meth:`Engine._stall`: 1 s, doubling up to
  :data:`BACKOFF_CAP_S`; after :data:`ISOLATE_AFTER` failed attempts the records of the
  partitions Kafka failed go one per record batch, so that a record Kafka keeps
  refusing is found and dead-lettered); the other tasks go on.
* The group's commit fails, or the kept tasks' offsets cannot be read: every task
  closes, what was fetched is fetched again, and the tasks start again from the
  committed offsets :data:`KAFKA_RETRY_S` later (:meth:`Engine.offer`).
* A store fails after Kafka took the cycle (:class:`StoreFailure`): the engine processes
  nothing more, with the reason in :attr:`Engine.failure`; the store is behind its
  changelog, and a restart restores it.
* The worker stops: the cycle in flight gets :data:`STOP_WAIT_S` to take effect and is
  then cut short, as a kill -9 would.

Nothing is skipped. The :class:`~tables.task.Checkpoint` of a task is its one record of applied
offsets: it filters records fetched again after a seek, it is what the task commits, and
the same offsets are written into every table partition the task writes
(:data:`POSITION_KEY`), in the changelog too, so a standby knows how far its copy goes
in terms of the source topics.

Timestamps: an output record that its batch function does not time gets the time of
the input records it came from (the largest of its batch's), or the worker's clock when
its topic would refuse that time; changelog records get the worker's clock
(:func:`tables.limits.stamp`, docs/architecture.md).

Nothing here imports faust or aiokafka: the worker plugs in a :class:`Connector` and its
:class:`Producer` parts (``tables/faust_adapter.py``, ``tables/producers.py``), and
tests plug in in-process ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

from core.topics import POSITION_KEY, dlq_topic
from tables.catchup import CatchUp
from tables.limits import TopicLimits
from tables.pipeline import TP as TP
from tables.pipeline import Output, Pipeline, SourceRecord, StorePartition
from tables.positions import Lineage
from tables.refusals import SendPlan, Undelivered, learn_failure, learn_refusals, undelivered_in
from tables.stalls import Stall, slow_report
from tables.task import Cycle, Figures, Limits, Task

logger = logging.getLogger(__name__)

#: Called after a cycle's writes reach a table partition's store: (table, partition,
#: the changes, None deleting, and the encoded position the partition now holds). The
#: changes hold the position under :data:`POSITION_KEY` too, which no UTF-8 key equals.
Listener = Callable[[str, int, Mapping[bytes, bytes | None], bytes | None], None]

#: Attempts at one cycle within one engine cycle, when refusals teach the task something
#: (the checks find culprits, Kafka refuses records, a producer is replaced).
MAX_ROUNDS = 6
#: Passes over one cycle's records while the checks before sending find more to refuse.
MAX_PASSES = 6
#: A task whose cycle failed tries again after BACKOFF_BASE_S, then twice as long after
#: each further failed attempt, up to BACKOFF_CAP_S.
BACKOFF_BASE_S = 1.0
BACKOFF_CAP_S = 30.0
#: Failed attempts of one cycle before the records of the partitions Kafka failed go one
#: per record batch (a record Kafka keeps refusing while it takes others is the record's
#: problem: its input is dead-lettered).
ISOLATE_AFTER = 3
#: A cycle in flight this long shows as stalled too (waiting on Kafka, or applying a
#: large fetch in checked batches).
SLOW_CYCLE_S = 10.0
#: After the group's offsets could not be committed, the tasks start again this many
#: seconds later (a task whose own cycle fails backs off by itself).
KAFKA_RETRY_S = 1.0
#: At a stop, how long the cycle in flight may take to take effect before it is cut short.
STOP_WAIT_S = 5.0


class EngineFailure(RuntimeError):
    """Kafka failed under a cycle: the cycle did not take effect, and its task starts
    again from the committed offsets once Kafka answers."""


class CycleFailed(EngineFailure):
    """Kafka did not take some record batches of a task's cycle."""

    def __init__(self, partition: int, undelivered: Undelivered) -> None:
        super().__init__(f"task {partition}: Kafka did not take the batch: {undelivered}")
        self.undelivered = undelivered


class StoreFailure(EngineFailure):
    """A store failed after Kafka took the cycle: the store is behind its changelog, so
    the engine processes nothing more; a restart restores it from the changelog."""


class CommitRefused(Exception):
    """The consumer group refused a commit because it rebalanced meanwhile."""


class TableStore(Protocol):
    """One table's local store on this worker."""

    name: str

    @property
    def changelog_topic(self) -> str: ...

    def partition(self, partition: int) -> StorePartition: ...

    def apply(
        self, partition: int, changes: Mapping[bytes, bytes | None], changelog_offset: int | None
    ) -> None:
        """Write ``changes`` (None deletes) and the changelog offset, atomically."""
        ...

    def position(self, partition: int) -> bytes | None:
        """The encoded :class:`~tables.positions.Position` a partition holds, if any."""
        ...


class ServedStore(TableStore, Protocol):
    """A table store the query layer reads too, through :meth:`partition` and
    :meth:`position`, as the engine does."""

    def persisted_offset(self, partition: int) -> int | None:
        """The last changelog offset the partition holds (None: none yet)."""
        ...

    def held(self, partition: int) -> bool:
        """Whether the partition's database is open here now: a read never opens one (a
        rebalance may be closing it)."""
        ...


#: A producer opened ahead of its task's start, and the committed offsets read after its
#: start ({} when they were not read).
Opened = tuple["Producer", dict[TP, "int | None"]]


class Producer(Protocol):
    """A task's producer: the Kafka calls the engine puts in order (:meth:`Engine._produce`).

    Under exactly_once a transactional producer of the task's own; under at_least_once
    the task's view of the worker's idempotent producer (no transactions)."""

    async def open(self) -> None:
        """Before the task's first cycle (a transactional one fences the previous owner
        and aborts what it left open)."""

    async def send(self, records: Sequence[Output], plan: SendPlan) -> dict[TP, int]:
        """Produce ``records`` as record batches of one partition each and wait until
        Kafka holds them all; the last offset written per partition. Raises
        :class:`~tables.refusals.Undelivered` naming the batches Kafka did not take and
        those it took."""
        ...

    def transaction(self) -> AbstractAsyncContextManager[Any]:
        """exactly_once: a transaction, committed when the block ends and aborted when
        it raises."""
        ...

    async def send_offsets(self, offsets: Mapping[TP, int]) -> None:
        """exactly_once: the consumer group's next offsets, in the open transaction."""

    async def reset(self) -> None:
        """After a send failed: the producer cannot send to the failed partitions again
        (its sequence numbers went on past the refused batch); replace it."""

    async def close(self) -> None: ...


class Connector(Protocol):
    """The consumer group's calls and the producers that the engine needs."""

    def ready(self, partition: int) -> bool:
        """Whether this worker actively holds the partition's tables, restored."""
        ...

    def assigned(self, partition: int, topics: frozenset[str]) -> list[TP]:
        """The partitions numbered ``partition`` of ``topics`` assigned to this worker."""
        ...

    def producer(self, partition: int, *, transactional: bool) -> Producer:
        """Task ``partition``'s producer: a transactional one of its own, or a view of
        the worker's idempotent one."""
        ...

    async def committed(self, tps: Sequence[TP]) -> dict[TP, int | None]:
        """The group's committed offsets (final once the task's producer is open)."""
        ...

    async def seek(self, offsets: Mapping[TP, int | None]) -> None:
        """Fetch from these offsets next (None: from the beginning)."""
        ...

    async def commit(self, offsets: Mapping[TP, int]) -> None:
        """Commit the consumer group's offsets; :class:`CommitRefused` when the group
        rebalanced meanwhile."""
        ...

    async def prepare(self) -> None:
        """Wait for what every pipeline needs before its first batch (the catalogue)."""
        ...

    def pause(self, tps: Sequence[TP]) -> None:
        """Fetch nothing more of these partitions until :meth:`resume`."""
        ...

    def resume(self, tps: Sequence[TP]) -> None: ...

    async def limits(self, topics: Sequence[str]) -> dict[str, TopicLimits]:
        """The rules Kafka applies to records produced to ``topics`` (those it knows)."""
        ...

    async def close(self) -> None:
        """At the worker's stop, once every task is closed (the shared producer)."""


def backoff(attempts: int) -> float:
    """Seconds before attempt ``attempts + 1``, after ``attempts`` failed ones."""
    return float(min(BACKOFF_BASE_S * 2 ** max(attempts - 1, 0), BACKOFF_CAP_S))


class Engine:
    """The tasks of one worker and the one owner of their commit cycle (the module's
    docstring gives its order and its rules).

    ``exactly_once``: the processing guarantee, decided once by the settings."""

    def __init__(
        self,
        pipelines: Sequence[Pipeline],
        tables: Mapping[str, TableStore],
        connector: Connector,
        *,
        partitions: int,
        exactly_once: bool,
    ) -> None:
        self.pipelines = list(pipelines)
        self.tables = dict(tables)
        self.connector = connector
        self.partitions = partitions
        self.exactly_once = exactly_once
        self.lineage = Lineage.of(self.pipelines)
        #: called after each cycle's writes reach a table partition (the query layer's
        #: waits and change streams)
        self.listeners: list[Listener] = []
        self.topics = frozenset(topic for p in pipelines for topic in p.reads)
        written = {spec.name for p in pipelines for spec in p.writes}
        written |= {name for p in pipelines for name in p.lookups}
        if missing := written - set(tables):
            raise ValueError(f"pipelines write undeclared tables: {sorted(missing)}")
        #: every topic the engine sends to
        self.sends = frozenset(
            {t for p in pipelines for t in p.produces}
            | {dlq_topic(t) for t in self.topics}
            | {store.changelog_topic for store in self.tables.values()}
        )
        self.tasks: dict[int, Task] = {}
        self.figures = Figures()
        self.limits = Limits()
        #: partitions whose last cycle failed, until one succeeds
        self.stalls: dict[int, Stall] = {}
        #: why the engine stopped for good (a store failed), or None
        self.failure: str | None = None
        #: failed cycles and engine failures (:meth:`stores_epoch`)
        self._doubts = 0
        self._lock = asyncio.Lock()
        #: tasks kept through a rebalance whose offsets are not yet checked against the
        #: group's committed ones
        self._kept: set[int] = set()
        #: exactly_once: the transactional producers of partitions an assignment brought,
        #: opened as it comes, and then their committed offsets (final once the producer's
        #: start has fenced the previous owner), read beside the recovery instead of after
        #: it; taken by the partition's task when it starts under that assignment
        self._opening: dict[int, asyncio.Future[Opened]] = {}
        #: the topics' limits, read once the first assignment comes (see :meth:`keep`)
        self._limits_ahead: asyncio.Future[None] | None = None
        self._discards: set[asyncio.Future[None]] = set()
        #: what waits for the end of the next cycle that runs a task (:meth:`next_cycle`)
        self._cycle_waiters: list[asyncio.Future[None]] = []
        #: when the last assignment came, until the first cycle under it has committed
        self._assigned_at: float | None = None
        #: how much of each source partition a fetch hands out after a rebalance (the
        #: consumer asks before each fetch)
        self.catch_up = CatchUp()

    def fail(self, reason: str) -> None:
        """Stop processing for good: a store failed (the first reason is kept)."""
        self._doubts += 1
        if self.failure is not None:
            return
        self.failure = reason
        logger.error(
            "%s; the worker processes nothing more (it answers reads and reports the "
            "failure on /ready and /metrics); a restart restores the store from its "
            "changelog and resumes from the committed offsets",
            reason,
        )

    # -- the fetch loop's one call ----------------------------------------------------

    async def offer(
        self,
        fetched: Mapping[Any, Sequence[SourceRecord]],
        positions: Mapping[Any, int],
        *,
        settled: bool = True,
        starts: Mapping[Any, int] | None = None,
    ) -> None:
        """Hand one fetch to the engine; every failure is handled here (see the module's
        docstring). What it does not apply is fetched again: the consumer's position is
        past it, and a partition that receives nothing more would never start its task
        to seek back.

        ``settled`` is False when the group is rebalancing or the fetch belongs to an
        earlier generation: nothing is applied, the records come back once it settled,
        to the tasks the new assignment kept (:meth:`keep`) or to new ones started from
        the committed offsets. Cancelled (the worker stops), the cycle in flight gets
        :data:`STOP_WAIT_S` to take effect and is then cut short.

        ``starts``: per fetched partition, where known, the position its records follow
        on from; a task that starts with this fetch runs them at once when they follow
        on from its committed offset, rather than fetching them again."""
        if not fetched or self.failure is not None:
            return
        cycle = asyncio.ensure_future(self._offer(fetched, positions, settled, starts or {}))
        try:
            retry = await asyncio.shield(cycle)
        except asyncio.CancelledError:
            await self._cut_short(cycle)
            raise
        if retry:
            await asyncio.sleep(KAFKA_RETRY_S)

    async def _offer(
        self,
        fetched: Mapping[Any, Sequence[SourceRecord]],
        positions: Mapping[Any, int],
        settled: bool,
        starts: Mapping[Any, int],
    ) -> bool:
        """One fetch's cycle; True when the tasks start again after a pause."""
        if not settled:
            await self.refetch(fetched)
            return False
        try:
            await self.process(fetched, positions, starts)
        except StoreFailure as exc:
            self.fail(str(exc))
            await self.revoke()
        except EngineFailure as exc:
            # Not one task's failure (those stall on their own): the group's commit or
            # its committed offsets. Every task starts again from the committed offsets.
            await self.revoke()
            await self.refetch(fetched)
            logger.warning(
                "%s; the tasks start again from the committed offsets in %.0f s",
                exc,
                KAFKA_RETRY_S,
            )
            return True
        return False

    async def _cut_short(self, cycle: asyncio.Future[bool]) -> None:
        """At a stop: the cycle in flight takes effect (or fails) as a whole, unless a
        rebalance under the stop leaves it waiting on a consumer closed meanwhile. Cut
        short, it is like a kill -9: nothing of it took effect past what Kafka holds, and
        the partitions' next owners redo it from the committed offsets."""
        if cycle.done():
            return
        try:
            await asyncio.wait_for(asyncio.shield(cycle), STOP_WAIT_S)
        except TimeoutError:
            logger.warning(
                "the cycle in flight did not finish within %.0f s of the stop; it "
                "is cut short and redone from the committed offsets",
                STOP_WAIT_S,
            )
            cycle.cancel()

    async def refetch(self, fetched: Mapping[Any, Sequence[SourceRecord]]) -> None:
        """Seek each fetched source partition back to its first fetched record."""
        again = {
            TP(tp.topic, tp.partition): records[0].offset
            for tp, records in fetched.items()
            if records and tp.topic in self.topics
        }
        if again:
            await self.connector.seek(again)

    # -- the commit cycle ---------------------------------------------------------------

    async def process(
        self,
        fetched: Mapping[Any, Sequence[SourceRecord]],
        positions: Mapping[Any, int],
        starts: Mapping[Any, int] | None = None,
    ) -> None:
        """One engine cycle over everything fetched: each task's cycle (tasks in
        parallel), then the group's commit under at_least_once. Raises
        :class:`StoreFailure`, and :class:`EngineFailure` when the group's commit failed.

        ``positions``: the consumer's position of each assigned source partition right
        after the fetch (past the transaction markers it skipped); ``starts``: see
        :meth:`offer`."""
        async with self._lock:
            started = time.monotonic()
            by_partition: dict[int, dict[TP, Sequence[SourceRecord]]] = {}
            for raw_tp, batch in fetched.items():
                tp = TP(raw_tp.topic, raw_tp.partition)
                if tp.topic in self.topics and batch:
                    by_partition.setdefault(tp.partition, {})[tp] = batch
            moved = {TP(tp.topic, tp.partition): offset for tp, offset in positions.items()}
            for tp, offset in moved.items():
                task = self.tasks.get(tp.partition)
                if task is None or tp.partition in by_partition or tp.topic not in self.topics:
                    continue
                known = task.checkpoint.next.get(tp)
                if known is not None and offset > known:
                    # Only transaction markers lay between: commit past them, so that a
                    # caught-up partition shows no lag.
                    by_partition.setdefault(tp.partition, {})[tp] = ()
            if self._kept:
                await self._verify_kept()
            runs, new = [], []
            for partition, fetched_here in sorted(by_partition.items()):
                stall = self.stalls.get(partition)
                if stall is not None and not stall.due(started):
                    await self._hold(stall, fetched_here)
                    continue
                task = self.tasks.get(partition)
                if task is None:
                    new.append((partition, fetched_here))
                    continue
                runs.append((task, fetched_here))
            # The partitions a rebalance brought start together: each opens its producer
            # (a transactional one under exactly_once) and reads its committed offsets.
            if new:
                began = {TP(tp.topic, tp.partition): o for tp, o in (starts or {}).items()}
                ran = await asyncio.gather(*(self._start_or_stall(p, f, began) for p, f in new))
                runs += [(self.tasks[p], f) for (p, f), now in zip(new, ran, strict=True) if now]
            if not runs:
                return
            await self._commit(await self._run(runs, moved))
            self.figures.cycles += 1
            ended = time.monotonic()
            self.figures.cycle_seconds += ended - started
            taken = [len(b) for _, batches in runs for b in batches.values() if b]
            self.catch_up.observe(sum(taken), len(taken))
            if self._assigned_at is not None:
                # How long the partitions wait after a rebalance: to the first fetch that
                # reaches the engine, and to that cycle's commit.
                logger.info(
                    "first cycle after the assignment: %d records of %d partitions, "
                    "begun %.3f s and committed %.3f s after the assignment",
                    sum(taken),
                    len(runs),
                    started - self._assigned_at,
                    ended - self._assigned_at,
                )
                self._assigned_at = None
            waiters, self._cycle_waiters = self._cycle_waiters, []
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)

    def stores_epoch(self) -> int | None:
        """Under exactly_once, a count that moves whenever a store may have fallen behind
        what its task had Kafka commit: a cycle whose transaction failed (its commit may
        have taken effect all the same), or a failure of the engine. While it stays, each
        store holds every record its task committed, and only a transaction marker
        follows in its changelog. None under at_least_once."""
        return self._doubts if self.exactly_once else None

    async def next_cycle(self) -> None:
        """Wait until the next cycle that runs a task has committed (its tasks that
        Kafka refused stalled meanwhile); a cycle whose commit fails leaves it waiting
        for the next."""
        waiter = asyncio.get_running_loop().create_future()
        self._cycle_waiters.append(waiter)
        await waiter

    async def _run(
        self,
        runs: Sequence[tuple[Task, Mapping[TP, Sequence[SourceRecord]]]],
        moved: Mapping[TP, int],
    ) -> dict[TP, int]:
        """Run the tasks' cycles; a task whose records Kafka refused tries again at once
        with what it learned (a new producer, the topics' rules read again), up to
        :data:`MAX_ROUNDS` attempts; a task that still fails stalls."""
        committed: dict[TP, int] = {}
        for round_ in range(MAX_ROUNDS):
            results = await asyncio.gather(
                *(self._attempt(task, fetched, moved) for task, fetched in runs),
                return_exceptions=True,
            )
            again, reread = [], set[str]()
            for (task, fetched), result in zip(runs, results, strict=True):
                if isinstance(result, dict):
                    committed.update(result)
                    self._moving(task.partition)
                    continue
                if not isinstance(result, EngineFailure) or isinstance(result, StoreFailure):
                    raise result
                retry, topics = self._lesson(task, result)
                if retry and round_ + 1 < MAX_ROUNDS:
                    again.append((task, fetched))
                    reread |= topics
                    logger.info("%s; the task tries again with what Kafka said", result)
                else:
                    await self._stall(task.partition, fetched, result, task)
            if not again:
                break
            if reread:
                await self._read_limits(reread)
            for task, fetched in list(again):
                try:
                    await task.producer.reset()
                except Exception as exc:  # Kafka unreachable: the backoff takes over
                    again.remove((task, fetched))
                    failure = EngineFailure(
                        f"task {task.partition}: its producer could not be replaced: {exc!r}"
                    )
                    await self._stall(task.partition, fetched, failure, task)
            self.figures.retries["refusal"] += len(again)
            runs = again
        return committed

    async def _attempt(
        self, task: Task, fetched: Mapping[TP, Sequence[SourceRecord]], moved: Mapping[TP, int]
    ) -> dict[TP, int]:
        """One attempt at a task's cycle, in the cycle's order; the offsets it moved on
        (what to commit)."""
        begun = task.begin(fetched, moved)
        if begun is None:
            return {}
        records, offsets = begun
        try:
            cycle = self._build(task, records, offsets)  # the pipelines, on views; checked
            written = await self._produce(task, cycle, offsets)  # Kafka holds the cycle
            task.took(cycle, offsets)
            self._store(task, cycle, written)  # then the stores, then the listeners
        finally:
            task.busy_since = None
        task.end(offsets)
        return offsets

    def _build(
        self, task: Task, records: dict[str, Sequence[SourceRecord]], offsets: Mapping[TP, int]
    ) -> Cycle:
        """The cycle's records, checked against their topics' rules: while the checks
        refuse some, the pipelines that made them run again in checked batches, so that
        only the input records whose effects are refused are left out (dead-lettered)."""
        for _ in range(MAX_PASSES):
            cycle = task.build(records, offsets)
            if not cycle.refusals:
                return cycle
            if not learn_refusals(task.plan, cycle.refusals, cycle.work.provenance):
                break
        raise EngineFailure(
            f"task {task.partition}: a record the engine writes itself would be refused: "
            f"{cycle.refusals[0].reason}"
        )

    async def _produce(self, task: Task, cycle: Cycle, offsets: Mapping[TP, int]) -> dict[TP, int]:
        """Make Kafka hold the cycle; the last offset written per partition. Raises
        :class:`CycleFailed` when Kafka did not take some record batches, and
        :class:`EngineFailure` when it failed otherwise."""
        producer, plan = task.producer, task.sending(cycle)
        task.waiting = True
        try:
            if self.exactly_once:
                # One transaction: changelogs, outputs and the source offsets. A new
                # owner's producer fences this one, and aborts what it left open.
                async with producer.transaction():
                    written = await producer.send([*cycle.state, *cycle.outputs], plan)
                    if offsets:
                        await producer.send_offsets(offsets)
                return written
            # at_least_once: the outputs are acknowledged before any changelog record
            # goes. A crash in between sends the outputs again, and never leaves a
            # changelog saying a record was applied (a join's dedupe by offset) while its
            # outputs were lost. The offsets go with the group's commit (_commit).
            try:
                written = await producer.send(cycle.outputs, plan) if cycle.outputs else {}
            except Undelivered as undelivered:
                task.kept(undelivered.taken)
                raise
            if cycle.state:
                try:
                    written.update(await producer.send(cycle.state, plan))
                except Undelivered as undelivered:
                    task.kept([*cycle.outputs, *undelivered.taken])
                    raise
            return written
        except Exception as exc:
            self._doubts += 1
            # An abort that failed too still says which batches Kafka did not take.
            refused = undelivered_in(exc)
            if refused is not None:
                raise CycleFailed(task.partition, refused) from refused
            raise EngineFailure(
                f"task {task.partition}: Kafka did not take the batch: {exc!r}"
            ) from exc
        finally:
            task.waiting = False

    def _store(self, task: Task, cycle: Cycle, written: Mapping[TP, int]) -> None:
        """Kafka holds the cycle: its writes reach the stores, each table partition's
        with the changelog offset it reaches; then the listeners hear of them."""
        try:
            for name, items in cycle.changes.items():
                store = self.tables[name]
                offset = written.get(TP(store.changelog_topic, task.partition))
                store.apply(task.partition, items, offset)
        except Exception as exc:
            raise StoreFailure(f"task {task.partition}: the store failed: {exc!r}") from exc
        for name, items in cycle.changes.items():
            for listener in self.listeners:
                try:
                    listener(name, task.partition, items, items.get(POSITION_KEY))
                except Exception:  # a listener must not stop the engine
                    logger.exception("a listener failed on %s[%d]", name, task.partition)

    def _lesson(self, task: Task, failure: EngineFailure) -> tuple[bool, frozenset[str]]:
        """Whether a failed cycle is worth another attempt at once (Kafka refused records
        the task can now tell apart), and the topics whose rules to read again first."""
        if not isinstance(failure, CycleFailed):
            return False, frozenset()
        lesson = learn_failure(task.plan, failure.undelivered, task.provenance)
        return lesson.retry, lesson.topics

    async def _commit(self, committed: Mapping[TP, int]) -> None:
        """at_least_once: the group commits the offsets of the tasks whose cycles took
        effect (under exactly_once they went with each cycle's transaction)."""
        if not committed or self.exactly_once:
            return
        try:
            await self.connector.commit(committed)
        except CommitRefused as exc:
            # The group rebalanced meanwhile: the partitions' next owners process these
            # records again (at least once).
            logger.info("commit refused (%s): %d partitions are read again", exc, len(committed))
        except Exception as exc:
            raise EngineFailure(f"the offsets were not committed: {exc!r}") from exc

    # -- stalls -------------------------------------------------------------------------

    async def _stall(
        self,
        partition: int,
        fetched: Mapping[TP, Sequence[SourceRecord]],
        failure: EngineFailure,
        task: Task | None,
    ) -> None:
        """Close the task of a failed cycle, pause its partitions and schedule its next
        attempt (the records it fetched are fetched again then)."""
        stall = self.stalls.get(partition)
        # Where it is stuck: the next offset to apply, or the first record fetched for a
        # partition with nothing committed yet.
        inputs: dict[tuple[str, int], int | None] = {
            (tp.topic, tp.partition): records[0].offset
            for tp, records in fetched.items()
            if records
        }
        if task is not None:
            for tp, offset in task.checkpoint.next.items():
                if offset is not None or (tp.topic, tp.partition) not in inputs:
                    inputs[(tp.topic, tp.partition)] = offset
        if stall is None:
            stall = self.stalls[partition] = Stall(partition, "", "", inputs)
        stall.inputs = inputs
        if task is not None:
            self.tasks.pop(partition, None)
            stall.plan = task.plan
            stall.failed = (
                {f.tp for f in failure.undelivered.failures}
                if isinstance(failure, CycleFailed)
                else set()
            )
            try:
                await task.producer.close()
            except Exception:  # its next start replaces (and fences) the producer anyway
                logger.warning("task %d: its producer did not close", partition, exc_info=True)
        cause = failure.__cause__ if failure.__cause__ is not None else failure
        wait = backoff(stall.attempts + 1)
        stall.failed_again(str(failure), type(cause).__name__, time.monotonic() + wait)
        if stall.attempts >= ISOLATE_AFTER:
            stall.plan.isolate |= stall.failed
        self.figures.retries["backoff"] += 1
        logger.warning(
            "%s; partition %d pauses and tries again in %.0f s (attempt %d failed; stuck at %s)",
            failure,
            partition,
            wait,
            stall.attempts,
            ", ".join(f"{t}[{p}]@{o}" for (t, p), o in sorted(inputs.items())) or "its start",
        )
        await self._hold(stall, fetched)

    async def _hold(self, stall: Stall, fetched: Mapping[TP, Sequence[SourceRecord]]) -> None:
        """Keep a stalled partition's records for its next attempt."""
        tps = self.connector.assigned(stall.partition, self.topics)
        self.connector.pause(tps)
        stall.paused = True
        await self.refetch(fetched)

    def _moving(self, partition: int) -> None:
        stall = self.stalls.pop(partition, None)
        if stall is not None:
            logger.info(
                "partition %d moves again after %d failed attempts in %.1f s",
                partition,
                stall.attempts,
                time.monotonic() - stall.since,
            )

    async def tick(self) -> None:
        """Resume the stalled partitions whose next attempt is due (the fetch loop calls
        this at least once a second)."""
        if not self.stalls:
            return
        async with self._lock:
            now = time.monotonic()
            for partition, stall in list(self.stalls.items()):
                tps = self.connector.assigned(partition, self.topics)
                if not tps and partition not in self.tasks:
                    del self.stalls[partition]  # no longer this worker's
                    continue
                if stall.paused and stall.due(now):
                    self.connector.resume(tps)
                    stall.paused = False

    def stalled(self) -> list[dict[str, Any]]:
        """The partitions that cannot advance: their last cycle failed, or their cycle has
        been in flight for :data:`SLOW_CYCLE_S` or more."""
        now = time.monotonic()
        found = [
            stall.report(now)
            for partition, stall in sorted(self.stalls.items())
            if self.connector.assigned(partition, self.topics)
        ]
        for partition, task in sorted(self.tasks.items()):
            busy = task.busy_since
            if busy is not None and now - busy >= SLOW_CYCLE_S and partition not in self.stalls:
                found.append(slow_report(partition, task.busy_at, now - busy, task.waiting))
        return found

    # -- tasks --------------------------------------------------------------------------

    async def _read_limits(self, topics: Iterable[str]) -> None:
        """Read the rules of ``topics`` from Kafka; Kafka's defaults stay for the topics it
        does not describe."""
        try:
            found = await self.connector.limits(sorted(topics))
        except Exception as exc:  # the broker answers later: the defaults hold meanwhile
            logger.warning("the topics' limits could not be read: %r", exc)
            return
        self.limits.topics.update(found)
        self.limits.read = True

    async def _start_or_stall(
        self,
        partition: int,
        fetched: Mapping[TP, Sequence[SourceRecord]],
        starts: Mapping[TP, int],
    ) -> bool:
        try:
            return await self._start(partition, fetched, starts)
        except EngineFailure as exc:
            await self._stall(partition, fetched, exc, None)
            return False

    async def _start(
        self,
        partition: int,
        fetched: Mapping[TP, Sequence[SourceRecord]],
        starts: Mapping[TP, int],
    ) -> bool:
        """Set up the task of a partition this worker now holds; True when it runs what
        was fetched for it in this cycle: those records follow on from its committed
        offsets (``starts``, see :meth:`offer`). Else they are dropped and fetched again
        from the committed offsets."""
        if not self.connector.ready(partition):
            # Not restored here yet (or the group is rebalancing): fetch these records
            # again. Dropped, they would wait for the partition's next record to start
            # its task, and a partition that receives nothing more would never apply them.
            await self.refetch(fetched)
            return False
        await self.connector.prepare()
        reading = self._limits_ahead
        if not self.limits.read and reading is not None and not reading.done():
            await asyncio.shield(reading)
        if not self.limits.read:
            await self._read_limits(self.sends)
        # exactly_once: a transactional producer of the task's own, whose start fences
        # the partition's previous owner (so the committed offsets read next are final);
        # at_least_once: the worker's idempotent producer.
        opening = self._opening.pop(partition, None)
        try:
            if opening is not None:
                producer, ahead = await opening
            else:
                producer, ahead = await self._open_producer(partition), {}
        except Exception as exc:
            raise EngineFailure(f"task {partition}: its producer did not start: {exc!r}") from exc
        tps = sorted(set(self.connector.assigned(partition, self.topics)) | set(fetched))
        try:
            if all(tp in ahead for tp in tps):
                committed = {tp: ahead[tp] for tp in tps}
            else:
                committed = await self.connector.committed(tps)
            follows = all(
                committed.get(tp) is not None and starts.get(tp) == committed[tp] for tp in fetched
            )
            # The fetched partitions stay where they are when their records follow on
            # from the committed offsets: a seek would drop what the consumer holds.
            await self.connector.seek(
                {tp: o for tp, o in committed.items() if not (follows and tp in fetched)}
            )
        except Exception as exc:
            await producer.close()
            raise EngineFailure(f"task {partition}: no committed offsets: {exc!r}") from exc
        task = Task(
            partition,
            self.pipelines,
            self.tables,
            producer,
            self.figures,
            lineage=self.lineage,
            partitions=self.partitions,
            limits=self.limits,
        )
        task.load_positions()
        task.checkpoint.update({tp: o for tp, o in committed.items() if o is not None})
        for tp, offset in committed.items():
            task.checkpoint.next.setdefault(tp, offset)
        stall = self.stalls.get(partition)
        if stall is not None:
            task.plan = stall.plan
        self.tasks[partition] = task
        logger.info(
            "task %d started at %s",
            partition,
            ", ".join(f"{tp.topic}={o}" for tp, o in sorted(committed.items())),
        )
        return follows

    async def _open_producer(self, partition: int) -> Producer:
        producer = self.connector.producer(partition, transactional=self.exactly_once)
        await producer.open()
        return producer

    async def _open_ahead_one(self, partition: int, after: asyncio.Future[None] | None) -> Opened:
        if after is not None:
            # The previous assignment's producers close first: one still starting with
            # the same transactional id would otherwise fence this one.
            with contextlib.suppress(Exception):
                await asyncio.shield(after)
        producer = await self._open_producer(partition)
        tps = sorted(self.connector.assigned(partition, self.topics))
        try:
            committed = await self.connector.committed(tps)
        except Exception as exc:  # read again when the task starts
            logger.info("task %d: committed offsets not read ahead: %r", partition, exc)
            committed = {}
        return producer, committed

    def _open_ahead(self, partitions: Iterable[int], after: asyncio.Future[None] | None) -> None:
        """Start opening the producers of ``partitions`` now (exactly_once), then reading
        their committed offsets. The previous owners have ended their cycles by the time
        an assignment comes (the eager protocol revokes before the join), and a killed
        one's open transaction is aborted by the start, which fences it, as at a task's
        start; ``after``: the previous ones' close, awaited first."""
        for partition in partitions:
            if partition not in self.tasks and partition not in self._opening:
                opening = self._open_ahead_one(partition, after)
                self._opening[partition] = asyncio.ensure_future(opening)

    def _take_openings(self) -> list[tuple[int, asyncio.Future[Opened]]]:
        openings, self._opening = list(self._opening.items()), {}
        return openings

    @staticmethod
    async def _close_openings(openings: Iterable[tuple[int, asyncio.Future[Opened]]]) -> None:
        """Close producers opened ahead and not taken, each once its start ends."""
        for partition, opening in openings:
            try:
                producer, _ = await opening
            except Exception as exc:
                logger.info("task %d: its producer opened ahead did not start: %r", partition, exc)
                continue
            await producer.close()

    async def suspend(self) -> None:
        """The group is rebalancing: finish the cycle in flight (its offsets committed
        under the generation that applied it) and keep every task. The eager protocol
        revokes every partition at every rebalance, and most come back to the same
        worker: their tasks go on with their producers and applied offsets, and only
        those of the partitions that went elsewhere close (:meth:`keep`)."""
        async with self._lock:
            if self.tasks:
                logger.info("tasks %s suspended for the rebalance", sorted(self.tasks))

    async def keep(self, partitions: Collection[int]) -> None:
        """The group's new assignment gives this worker ``partitions``: close the tasks
        of the others. Every assignment passes here before anything is processed under
        it, so a kept task's applied offsets are the partition's last ones: no other
        worker held it in between."""
        async with self._lock:
            self._assigned_at = time.monotonic()
            self.catch_up.begin()
            gone = {p: task for p, task in self.tasks.items() if p not in partitions}
            for partition in gone:
                del self.tasks[partition]
            self._kept = set(self.tasks)
            await asyncio.gather(*(task.producer.close() for task in gone.values()))
            # Every assignment opens its own: what one read ahead may be stale under the
            # next (this worker may have been out of the group in between). Closed in the
            # background: a start under way may take a while, and nothing here waits for it.
            previous = self._take_openings()
            discard: asyncio.Future[None] | None = None
            if previous:
                discard = asyncio.ensure_future(self._close_openings(previous))
                self._discards.add(discard)
                discard.add_done_callback(self._discards.discard)
            if self.exactly_once:
                self._open_ahead(partitions, discard)
            reading = self._limits_ahead
            if partitions and not self.limits.read and (reading is None or reading.done()):
                # A worker's first tasks would read them as they start, after the
                # recovery: read while it runs.
                self._limits_ahead = asyncio.ensure_future(self._read_limits(self.sends))
            kept = sorted(self.tasks)
            logger.info(
                "assignment of partitions %s: tasks %s kept, %s closed",
                sorted(partitions),
                kept,
                sorted(gone),
            )

    async def _verify_kept(self) -> None:
        """Close the kept tasks whose partitions another worker committed past their
        applied offsets meanwhile (this worker was out of the group for a generation, its
        session timed out): their state and producers are stale, and they start again
        from the committed offsets. A kept task may be ahead of the committed offsets (a
        commit refused by the rebalance): what it applied is not applied twice."""
        kept, self._kept = self._kept, set()
        tasks = {p: self.tasks[p] for p in kept if p in self.tasks}
        tps = [tp for task in tasks.values() for tp in task.checkpoint.next]
        try:
            committed = await self.connector.committed(tps) if tps else {}
        except Exception as exc:
            raise EngineFailure(f"the kept tasks' committed offsets: {exc!r}") from exc
        stale = {
            partition
            for partition, task in tasks.items()
            for tp, applied in task.checkpoint.next.items()
            if (found := committed.get(tp)) is not None and found > (applied or 0)
        }
        for partition in sorted(stale):
            task = self.tasks.pop(partition)
            await task.producer.close()
            logger.warning(
                "task %d closed: the group committed past its offsets while this worker "
                "was out of it; it starts again from the committed offsets",
                partition,
            )

    async def revoke(self) -> None:
        """Finish the cycle in flight, then close every task (they start again from the
        committed offsets): at a stop, a failed store or a failed commit."""
        async with self._lock:
            tasks, self.tasks = self.tasks, {}
            self._kept = set()
            await asyncio.gather(*(task.producer.close() for task in tasks.values()))
            await self._close_openings(self._take_openings())
            await asyncio.gather(*self._discards)
            if tasks:
                logger.info("tasks %s closed", sorted(tasks))

    async def close(self) -> None:
        """At the worker's stop: every task closes, then the connector's producers."""
        await self.revoke()
        if self._limits_ahead is not None:
            self._limits_ahead.cancel()
        await self.connector.close()

    def lag(self, highwaters: Mapping[Any, int]) -> dict[TP, int]:
        """Records between each source partition's end and its task's checkpoint."""
        lag = {}
        for task in self.tasks.values():
            for tp, offset in task.checkpoint.next.items():
                end = highwaters.get(tp)
                if end is not None:
                    lag[tp] = max(0, end - (offset or 0))
        return lag
