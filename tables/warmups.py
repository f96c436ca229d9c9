"""Warm handover: an active partition moves only to a member whose copy is caught up.

faust's assignor balances the active partitions over the members and keeps most where
they were, but a partition it moves starts on its new owner from whatever copy is there:
on a member that just joined, none, so the partition waits for a full restore. Here the
leader checks each move against the lag the new owner reported for its copy of the
partition's changelogs (its standby), as Kafka Streams does with warm-up replicas
(KIP-441):

- a move to a copy more than ``acceptable_recovery_lag`` records behind is taken back:
  the previous owner keeps the partition, and the new owner gets it as a standby to warm
  up (a *warm-up*);
- a member left short of its balanced share takes instead a partition it holds a warm
  copy of, from a member over its share;
- a member with warm-ups asks for a follow-up rebalance once they are within the lag
  (:class:`WarmupWatch`), and the leader moves them then.

A partition whose previous owner has left (a stop or a crash) is measured against the
copy of it furthest along among the members (a standby, as a rule): it goes where faust
puts it if that member's copy is within the lag, else to the member with the furthest
copy, and the member faust chose takes instead a partition it holds a warm copy of from
a member over its share, or warms this one up. Members tell the leader the changelog
offset each of their copies holds (actives, standbys, and the copies left on their disk
by an earlier process, from the file :class:`WarmupWatch` keeps), and the leader measures
a copy's lag against the furthest copy of the partition reported (its owner's). The
leader tells a member its warm-ups in its assignment. Both ride in a ``streamstate``
entry of faust's JSON user data (faust reads past it).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)
from faust.assignor import PartitionAssignor
from faust.assignor.client_assignment import ClientAssignment, ClientMetadata
from faust.types import TP
from mode import Service

logger = logging.getLogger(__name__)

#: The key of this module's entry in faust's JSON user data.
ENTRY = "streamstate"
#: Offsets a member reports: changelog topic -> partition -> the last offset its copy
#: holds.
Offsets = Mapping[str, Mapping[int, int]]
#: The file, in the tables' directory, where a worker keeps its copies' offsets.
COPIES_FILE = "copies.json"


@dataclass
class Handover:
    """The plan for one co-partitioned group of topics."""

    #: partition -> its owner once warm-ups are taken into account
    actives: dict[int, str]
    #: member -> partitions it warms up (held back from it for now)
    warmups: dict[str, set[int]] = field(default_factory=dict)
    #: (member, partition) -> its copy's lag when held back (None: no copy reported)
    behind: dict[tuple[str, int], int | None] = field(default_factory=dict)


def plan_handover(
    proposed: Mapping[int, str],
    previous: Mapping[int, str],
    lag: Any,
    acceptable: int,
) -> Handover:
    """Take back the moves of ``proposed`` (partition -> member) to copies more than
    ``acceptable`` records behind, and even out with warm copies.

    ``previous`` holds the partitions' owners of the last assignment that are still
    members; ``lag(member, partition)`` is the lag of the member's copy, or None when it
    has none. The members' shares are those of ``proposed``."""

    def warm(member: str, partition: int) -> bool:
        if previous.get(partition) == member:
            return True
        behind = lag(member, partition)
        return behind is not None and behind <= acceptable

    actives = dict(proposed)
    held_back: list[tuple[str, int]] = []
    for partition, member in sorted(proposed.items()):
        owner = previous.get(partition)
        if owner is None or owner == member or warm(member, partition):
            continue
        actives[partition] = owner
        held_back.append((member, partition))
    share = Counter(proposed.values())
    count = Counter(actives.values())
    for member, _ in held_back:
        while count[member] < share[member]:
            choices = [
                (lag(member, p), p)
                for p, owner in actives.items()
                if owner != member and count[owner] > share[owner] and warm(member, p)
            ]
            if not choices:
                break
            _, partition = min(choices)
            count[actives[partition]] -= 1
            actives[partition] = member
            count[member] += 1
    warmups: dict[str, set[int]] = defaultdict(set)
    for member, partition in held_back:
        if actives[partition] != member and count[member] < share[member]:
            warmups[member].add(partition)
    behind = {(m, p): lag(m, p) for m, ps in warmups.items() for p in ps}
    return Handover(actives, dict(warmups), behind)


def _decode(data: bytes) -> dict[str, Any]:
    found = json.loads(data)
    return found if isinstance(found, dict) else {}


class WarmupAssignor(PartitionAssignor):
    """faust's assignor with warm handover (see the module's docstring)."""

    #: lag beyond which a copy is not warm, unless the app's settings say otherwise
    default_acceptable_lag = 10_000

    def __init__(self, app: Any, replicas: int = 0) -> None:
        super().__init__(app, replicas)
        #: this member's warm-ups: changelog topic -> partitions (from its assignment)
        self.warmups: dict[str, list[int]] = {}
        #: how many assignments this member has had; its watch asks once per assignment
        self.assignments = 0
        self.assigned_at = time.monotonic()
        #: this member's standby lags as last measured (:class:`WarmupWatch`)
        self.lags: dict[str, dict[int, int]] = {}
        #: the offsets of this member's copies as last measured, or as an earlier process
        #: left them on disk (:class:`WarmupWatch`)
        self.offsets: dict[str, dict[int, int]] = read_copies(_copies_path(app))

    @property
    def acceptable_lag(self) -> int:
        settings = getattr(self.app, "settings", None)
        found = getattr(settings, "acceptable_recovery_lag", None)
        return self.default_acceptable_lag if found is None else int(found)

    @property
    def enabled(self) -> bool:
        settings = getattr(self.app, "settings", None)
        return bool(getattr(settings, "warm_handover", True))

    # -- the member's side ---------------------------------------------------------------

    def metadata(self, topics: set[str]) -> ConsumerProtocolMemberMetadata:
        base = super().metadata(topics)
        data = _decode(base.user_data)
        data[ENTRY] = {"offsets": self.offsets}
        return ConsumerProtocolMemberMetadata(
            base.version, base.subscription, json.dumps(data).encode()
        )

    def on_assignment(self, assignment: ConsumerProtocolMemberAssignment) -> None:
        super().on_assignment(assignment)
        entry = _decode(self._decompress(assignment.user_data)).get(ENTRY) or {}
        self.warmups = {
            str(topic): [int(p) for p in partitions]
            for topic, partitions in (entry.get("warmups") or {}).items()
        }
        self.assignments += 1
        self.assigned_at = time.monotonic()
        if self.warmups:
            partitions = sorted({p for ps in self.warmups.values() for p in ps})
            logger.info(
                "warming up partitions %s (%d changelogs) before they move here",
                partitions,
                len(self.warmups),
            )

    # -- the leader's side ---------------------------------------------------------------

    def _perform_assignment(self, cluster: Any, member_metadata: Any) -> Any:
        proposed = super()._perform_assignment(cluster, member_metadata)
        if not self.enabled:
            return proposed
        return self._hand_over_warm(proposed, member_metadata)

    def _hand_over_warm(self, proposed: Any, member_metadata: Any) -> Any:
        joined = {m: _decode(meta.user_data) for m, meta in member_metadata.items()}
        previous = {
            m: self._get_client_metadata(meta).assignment for m, meta in member_metadata.items()
        }
        reported = {m: _offsets((d.get(ENTRY) or {}).get("offsets")) for m, d in joined.items()}
        metas = {
            m: ClientMetadata.loads(self._decompress(a.user_data)) for m, a in proposed.items()
        }
        assignments: dict[str, ClientAssignment] = {m: meta.assignment for m, meta in metas.items()}
        topic_groups = next(iter(metas.values())).topic_groups if metas else {}
        changelogs = set(self._table_manager.changelog_topics) - _global_changelogs(self.app)
        groups: dict[int, set[str]] = defaultdict(set)
        for topic, group in topic_groups.items():
            groups[group].add(topic)
        warmups: dict[str, dict[str, list[int]]] = defaultdict(dict)
        moved = False
        for topics in groups.values():
            logs = sorted(topics & changelogs)
            if not logs:
                continue
            handover = self._plan_group(topics, logs, assignments, previous, reported)
            if handover is None:
                continue
            moved |= _apply(handover, topics, assignments)
            for member, partitions in handover.warmups.items():
                for topic in logs:
                    warmups[member][topic] = sorted(partitions)
                logger.info(
                    "assignment holds back %s from %s until its copies are warm (records "
                    "behind the owner's: %s)",
                    sorted(partitions),
                    metas[member].url,
                    [handover.behind.get((member, p)) for p in sorted(partitions)],
                )
        if not moved and not warmups:
            return proposed
        result = self._protocol_assignments(
            assignments,
            self._get_changelog_distribution(assignments),
            self._get_external_topic_distribution(assignments),
            topic_groups,
        )
        for member, entry in warmups.items():
            given = result[member]
            data = _decode(self._decompress(given.user_data))
            data[ENTRY] = {"warmups": entry}
            result[member] = ConsumerProtocolMemberAssignment(
                given.version, given.assignment, self._compress(json.dumps(data).encode())
            )
        return result

    def _plan_group(
        self,
        topics: set[str],
        logs: list[str],
        assignments: Mapping[str, ClientAssignment],
        previous: Mapping[str, ClientAssignment],
        reported: Mapping[str, Offsets],
    ) -> Handover | None:
        lead = logs[0]
        proposed = _owners(assignments, lead)
        if proposed is None:
            return None
        before = _owners({m: a for m, a in previous.items() if m in assignments}, lead)
        if before is None:
            return None
        # A partition whose owner left is measured against the furthest copy of it.
        orphans = sorted(set(proposed) - set(before))
        before.update(furthest_copies(orphans, proposed, reported, logs))

        def lag(member: str, partition: int) -> int | None:
            """How far the member's copy is behind the previous owner's, over the
            partition's changelogs (one the owner wrote nothing to yet is no lag); None
            when the owner wrote one the member has no copy of."""
            owner = before.get(partition)
            if owner is None:
                return None
            found = [0]
            for topic in logs:
                ahead = reported[owner].get(topic, {}).get(partition)
                if ahead is None:
                    continue
                mine = reported[member].get(topic, {}).get(partition)
                if mine is None:
                    return None
                found.append(max(0, ahead - mine))
            return max(found)

        return plan_handover(proposed, before, lag, self.acceptable_lag)


def furthest_copies(
    partitions: Iterable[int],
    proposed: Mapping[int, str],
    reported: Mapping[str, Offsets],
    logs: Iterable[str],
) -> dict[int, str]:
    """For each of ``partitions``, the member whose copy is furthest along: the least
    behind, over the partition's changelogs, the furthest copy any member reported
    (faust's choice, ``proposed``, on a tie). A partition of which no member reported a
    copy is left out."""
    logs = list(logs)
    found: dict[int, str] = {}
    for partition in partitions:
        ends = {}
        for topic in logs:
            held = [o[topic][partition] for o in reported.values() if partition in o.get(topic, {})]
            if held:
                ends[topic] = max(held)
        if not ends:
            continue
        ranked = []
        for member, offsets in reported.items():
            mine = {t: offsets.get(t, {}).get(partition) for t in ends}
            if None not in mine.values():
                behind = max(end - (mine[t] or 0) for t, end in ends.items())
                ranked.append((behind, member != proposed.get(partition), member))
        if ranked:
            found[partition] = min(ranked)[2]
    return found


def _offsets(raw: Any) -> dict[str, dict[int, int]]:
    """A member's reported offsets, as sent (JSON: partition numbers as strings)."""
    if not isinstance(raw, dict):
        return {}
    return {
        str(topic): {int(p): int(n) for p, n in partitions.items()}
        for topic, partitions in raw.items()
        if isinstance(partitions, dict)
    }


def _global_changelogs(app: Any) -> set[str]:
    return {
        table._changelog_topic_name()
        for table in app.tables.data.values()
        if getattr(table, "is_global", False)
    }


def _owners(assignments: Mapping[str, ClientAssignment], topic: str) -> dict[int, str] | None:
    """partition -> the member holding it active; None when one is active on two."""
    found: dict[int, str] = {}
    for member, assignment in assignments.items():
        for partition in assignment.actives.get(topic, []):
            if partition in found:
                return None
            found[partition] = member
    return found


def _apply(
    handover: Handover, topics: Iterable[str], assignments: Mapping[str, ClientAssignment]
) -> bool:
    """Give each partition of the group to its planned owner, in every topic of the
    group: the owner drops its standby of it, the member it was taken from keeps one."""
    topics = sorted(topics)
    moved = False
    for member, assignment in assignments.items():
        for topic in topics:
            held = assignment.actives.get(topic)
            if held is None:
                continue
            for partition in list(held):
                owner = handover.actives.get(partition, member)
                if owner == member:
                    continue
                moved = True
                held.remove(partition)
                taker = assignments[owner]
                taker.actives.setdefault(topic, []).append(partition)
                taken = taker.standbys.get(topic)
                if taken is not None and partition in taken:
                    taken.remove(partition)
                kept = assignment.standbys.setdefault(topic, [])
                if partition not in kept:
                    kept.append(partition)
    for assignment in assignments.values():
        for topic in topics:
            for which in (assignment.actives, assignment.standbys):
                if topic in which:
                    which[topic] = sorted(which[topic])
    return moved


def copy_offsets(app: Any) -> dict[str, dict[int, int]]:
    """The last changelog offset each copy this worker holds open has written (actives
    and standbys alike; standbys as of their last flush)."""
    offsets: dict[str, dict[int, int]] = defaultdict(dict)
    for table in list(app.tables.values()):
        if getattr(table, "is_global", False):
            continue
        topic = table._changelog_topic_name()
        store = table.data
        for partition in list(getattr(store, "_dbs", {})):
            offset = store.persisted_offset(TP(topic, partition))
            if offset is not None:
                offsets[topic][partition] = int(offset)
    return dict(offsets)


def _copies_path(app: Any) -> Path | None:
    tabledir = getattr(getattr(app, "conf", None), "tabledir", None)
    return None if tabledir is None else Path(tabledir) / COPIES_FILE


def read_copies(path: Path | None) -> dict[str, dict[int, int]]:
    """The offsets an earlier process of this worker left on disk ({} if none)."""
    if path is None:
        return {}
    try:
        return _offsets(json.loads(path.read_text()))
    except (OSError, ValueError, TypeError, AttributeError):
        return {}


def write_copies(path: Path, offsets: Offsets) -> None:
    """Keep ``offsets`` on disk for the next process, replaced atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".tmp")
    partial.write_text(json.dumps(offsets))
    os.replace(partial, path)


def standby_lags(app: Any) -> dict[str, dict[int, int]]:
    """The lag of each standby copy this worker keeps: the partition's end as its
    consumer last fetched it, less the records applied."""
    recovery = app.tables.recovery
    consumer = app.consumer
    lags: dict[str, dict[int, int]] = defaultdict(dict)
    for tp in list(recovery.standby_tps):
        applied = recovery.standby_offsets.get(tp)
        try:
            end = consumer.highwater(tp)
        except Exception:  # not fetched yet
            continue
        if end is None or end < 0:
            continue
        done = -1 if applied is None else int(applied)
        lags[tp.topic][tp.partition] = max(0, int(end) - 1 - done)
    return dict(lags)


class WarmupWatch(Service):
    """Measures this worker's standby lags for its join metadata, and asks for the
    follow-up rebalance once its warm-ups are within the acceptable lag: all of them,
    or some of them ``probe_after_s`` after the assignment.

    It never asks sooner than ``settle_s`` after its assignment: under the eager protocol
    the follow-up pauses every partition of the group again, and one that came on the
    heels of the first would make a single pause of both for the partitions that stay."""

    #: Seconds after an assignment before the follow-up rebalance may be asked for.
    settle_s = 3.0
    #: The copies' offsets go to disk every this many checks; with no warm-up to watch,
    #: they are measured only that often too.
    write_every = 4

    def __init__(
        self,
        app: Any,
        *,
        interval: float = 0.25,
        probe_after_s: float = 10.0,
        rejoin: Callable[[], Awaitable[None]] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.app = app
        self.interval = interval
        self.probe_after_s = probe_after_s
        self.rejoin = rejoin or functools.partial(request_rejoin, app)
        self._asked_for = -1
        self._asked_about: set[tuple[str, int]] = set()
        self._ticks = 0

    @Service.task
    async def _watch(self) -> None:
        while not self.should_stop:
            await self.sleep(self.interval)
            try:
                await self.check()
            except Exception as exc:  # a consumer between assignments: next round
                logger.debug("warm-up check skipped: %r", exc)

    async def check(self) -> bool:
        """Measure; True when it asked the group to rebalance."""
        assignor = self.app.assignor
        if not isinstance(assignor, WarmupAssignor):
            return False
        self._ticks += 1
        due = self._ticks % self.write_every == 0
        if not assignor.warmups and not due:
            return False
        lags = standby_lags(self.app)
        assignor.lags = lags
        if not self.app.rebalancing:
            # What the copies held open say, over what the disk said of the others (a
            # copy this process no longer holds keeps the offset it was left at).
            assignor.offsets = {**assignor.offsets, **copy_offsets(self.app)}
            path = _copies_path(self.app)
            if path is not None and due:
                await asyncio.to_thread(write_copies, path, assignor.offsets)
        if not assignor.warmups or assignor.assignments == self._asked_for:
            return False
        if self.app.rebalancing:
            return False
        acceptable = assignor.acceptable_lag
        wanted = [(t, p) for t, ps in assignor.warmups.items() for p in ps]
        warm = [(t, p) for t, p in wanted if lags.get(t, {}).get(p, acceptable + 1) <= acceptable]
        waited = time.monotonic() - assignor.assigned_at
        # The same warm-ups back after asking: the leader found them behind still (they
        # fell behind again meanwhile); ask again only after the longer wait.
        again = set(wanted) == self._asked_about
        if waited < (self.probe_after_s if again else self.settle_s):
            return False
        if len(warm) < len(wanted) and not (warm and waited >= self.probe_after_s):
            return False
        self._asked_for = assignor.assignments
        self._asked_about = set(wanted)
        logger.info(
            "warm-ups within %d records (%d of %d) after %.1f s: asking the group to rebalance",
            acceptable,
            len(warm),
            len(wanted),
            waited,
        )
        await self.rejoin()
        return True


async def request_rejoin(app: Any) -> None:
    """Ask the group's coordinator for a rebalance, from the consumer's own thread."""
    consumer: Any = app.consumer

    async def rejoin() -> None:
        coordinator = consumer._thread._consumer._coordinator
        coordinator.request_rejoin()

    await consumer._thread.call_thread(rejoin)
