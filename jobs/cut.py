"""The offset cut: where the job reads the source topics and the changelogs up to.

The cut is taken once, at the start, as the end offsets of every partition (the last
stable offset, as a ``read_committed`` consumer sees it). The live tables can only be
compared with a recompute of the same records if the workers had applied exactly those
records when the changelog cut was taken, so the cut waits (up to ``settle_s``) for a
quiet moment: the source and changelog end offsets unchanged across the sampling, and no
record of any topic the consumer group reads that the group has not committed. If that
moment never comes (a busy pipeline), the cut is taken anyway and reported unsettled.
A group with no member (no worker running) cannot catch up, so the cut does not wait
for it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import TypeVar

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import GroupCoordinatorNotAvailableError

Offsets = dict[str, dict[int, int]]
T = TypeVar("T")

#: Lookups of the group coordinator before the cut gives up, and the pause between.
COORDINATOR_ATTEMPTS = 20
COORDINATOR_RETRY_S = 0.5


@dataclass(frozen=True)
class Cut:
    """End offsets of the sources and the changelogs, and how settled the group was."""

    sources: Offsets
    changelogs: Offsets
    log_start: Offsets
    taken_at_ms: int
    settled: bool
    group_lag: dict[str, int] = field(default_factory=dict)
    #: Members of the consumer group when the cut was taken (None: unknown).
    group_members: int | None = None

    def as_json(self) -> dict[str, dict[str, int]]:
        merged = {**self.sources, **self.changelogs}
        return {t: {str(p): o for p, o in sorted(parts.items())} for t, parts in merged.items()}

    @property
    def lag(self) -> int:
        return sum(self.group_lag.values())


def _group(offsets: dict[TopicPartition, int]) -> Offsets:
    out: Offsets = {}
    for tp, offset in offsets.items():
        out.setdefault(tp.topic, {})[tp.partition] = offset
    return {topic: dict(sorted(parts.items())) for topic, parts in sorted(out.items())}


class OffsetReader:
    """End offsets, log-start offsets and a consumer group's progress, over one consumer."""

    def __init__(self, bootstrap: str, group: str) -> None:
        self.bootstrap = bootstrap
        self.group = group
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            group_id=None,
            enable_auto_commit=False,
            isolation_level="read_committed",
        )
        self._admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)

    async def __aenter__(self) -> OffsetReader:
        await self._consumer.start()
        await self._admin.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._consumer.stop()
        await self._admin.close()

    async def partitions(self, topics: Iterable[str]) -> list[TopicPartition]:
        """The partitions of the topics that exist (a missing topic has none)."""
        existing = set(await self._admin.list_topics())
        wanted = [t for t in topics if t in existing]
        if not wanted:
            return []
        described = await self._admin.describe_topics(wanted)
        return sorted(
            TopicPartition(d["topic"], p["partition"]) for d in described for p in d["partitions"]
        )

    async def internal_topics(self, prefix: str, extra: list[str]) -> list[str]:
        """The group's repartition topics (``<app id>-*-repartition``) and ``extra``."""
        names = await self._admin.list_topics()
        return sorted(
            name
            for name in names
            if (name.startswith(f"{prefix}-") and name.endswith("-repartition")) or name in extra
        )

    async def ends(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        return dict(await self._consumer.end_offsets(tps)) if tps else {}

    async def starts(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        return dict(await self._consumer.beginning_offsets(tps)) if tps else {}

    async def _coordinated(self, request: Callable[[], Awaitable[T]]) -> T:
        """``request`` to the group coordinator, asked again while there is none yet.

        On a cluster where no group has ever joined, the first lookup creates the offsets
        topic and fails until its leader is elected; a coordinator moving during a broker
        failover fails the same way for a moment.
        """
        for _ in range(COORDINATOR_ATTEMPTS - 1):
            try:
                return await request()
            except GroupCoordinatorNotAvailableError:
                await asyncio.sleep(COORDINATOR_RETRY_S)
        return await request()

    async def committed(self) -> dict[TopicPartition, int]:
        """The committed offsets of the group."""
        answer = await self._coordinated(
            lambda: self._admin.list_consumer_group_offsets(self.group)
        )
        return {tp: meta.offset for tp, meta in answer.items() if meta.offset >= 0}

    async def members(self) -> int | None:
        """How many members the consumer group has now (None: the broker did not say)."""
        try:
            responses = await self._coordinated(
                lambda: self._admin.describe_consumer_groups([self.group])
            )
        except Exception:  # an older broker or a lasting error: assume someone is there
            return None
        for response in responses:
            # DescribeGroups: (error_code, group_id, state, protocol_type, protocol, members...)
            for described in response.groups:
                if described[1] == self.group and described[0] == 0:
                    return len(described[5])
        return None

    async def unread(
        self, positions: dict[TopicPartition, int], ends: dict[TopicPartition, int]
    ) -> dict[TopicPartition, int]:
        """Records between ``positions`` and ``ends`` per partition, markers not counted."""
        behind = {tp: pos for tp, pos in positions.items() if pos < ends.get(tp, 0)}
        found: dict[TopicPartition, int] = {}
        if not behind:
            return found
        consumer = self._consumer
        consumer.assign(list(behind))
        for tp, pos in behind.items():
            consumer.seek(tp, pos)
        open_tps = set(behind)
        deadline = time.monotonic() + 10.0
        while open_tps and time.monotonic() < deadline:
            batches = await consumer.getmany(*open_tps, timeout_ms=200)
            for tp, records in batches.items():
                count = sum(1 for r in records if r.offset < ends[tp])
                if count:
                    found[tp] = found.get(tp, 0) + count
                    open_tps.discard(tp)
            for tp in list(open_tps):
                # A read_committed consumer steps over transaction markers.
                if await consumer.position(tp) >= ends[tp]:
                    open_tps.discard(tp)
        consumer.assign([])
        for tp in open_tps:
            found[tp] = ends[tp] - behind[tp]
        return found


async def _sample(
    reader: OffsetReader,
    sources: list[TopicPartition],
    changelogs: list[TopicPartition],
    internal: list[TopicPartition],
) -> tuple[dict[TopicPartition, int], dict[TopicPartition, int], dict[str, int], bool]:
    source_ends = await reader.ends(sources)
    changelog_ends = await reader.ends(changelogs)
    committed = await reader.committed()
    # A topic the group has not committed on yet still counts: the sources and the
    # internal topics between agents (repartition topics, corrections).
    read_by_group = sorted(set(committed) | set(sources) | set(internal))
    group_ends = await reader.ends(read_by_group)
    positions = {tp: committed.get(tp, 0) for tp in read_by_group}
    lag: dict[str, int] = {}
    for tp, behind in (await reader.unread(positions, group_ends)).items():
        lag[tp.topic] = lag.get(tp.topic, 0) + behind
    stable = (
        await reader.ends(changelogs) == changelog_ends
        and await reader.ends(sources) == source_ends
    )
    return source_ends, changelog_ends, lag, stable and not lag


async def take_cut(
    bootstrap: str,
    source_topics: list[str],
    changelog_topics: list[str],
    internal_topics: list[str],
    group: str,
    settle_s: float,
) -> Cut:
    """Sample the end offsets until the group has caught up with them, or ``settle_s``."""
    async with OffsetReader(bootstrap, group) as reader:
        sources = await reader.partitions(source_topics)
        changelogs = await reader.partitions(changelog_topics)
        internal = await reader.partitions(await reader.internal_topics(group, internal_topics))
        deadline = time.monotonic() + settle_s
        while True:
            taken_at_ms = int(time.time() * 1000)
            source_ends, changelog_ends, lag, settled = await _sample(
                reader, sources, changelogs, internal
            )
            members = await reader.members()
            if settled or members == 0 or time.monotonic() >= deadline:
                break
            await asyncio.sleep(1.0)
        starts = await reader.starts(sources)
    return Cut(
        sources=_group(source_ends),
        changelogs=_group(changelog_ends),
        log_start=_group({tp: o for tp, o in starts.items() if o > 0}),
        taken_at_ms=taken_at_ms,
        settled=settled,
        group_lag=lag,
        group_members=members,
    )
