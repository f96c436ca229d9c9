"""Scaling out and in under load: 2 workers, a third joins, then leaves with SIGTERM.

Two workers process the load (chaos/load.py); each round a third worker starts, the group
hands it some partitions, the load runs on, and the third worker is stopped with SIGTERM,
its partitions going back to the two. A :class:`PartitionWatch` samples the group's
committed offset and the end offset of every input partition five times a second: a
partition *stalls* while its committed offset stands still with records waiting behind
it (end past committed). Each scaling step's stalls are split by where the partition
went: those that stayed with their owner and those that moved to another worker. Key
reads of a fixed set go through the two lasting workers all along; at the end the load
pauses, the group catches up and every table is compared with the truth.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient

from chaos.env import Group, crashes, group, reset, wait_ready, workdir
from chaos.lag import GROUP, INPUTS, LagMonitor, sample_of, watch_only
from chaos.load import LoadLevel
from chaos.probe import ReadProbe, keys_to_read
from chaos.reader import committed_offsets
from chaos.session import Session
from tests.support.kafka import LocalKafka
from tests.support.workers import Worker

TopicPartition = tuple[str, int]
#: Offsets per input partition at one moment: (when, committed, end).
Offsets = tuple[float, dict[TopicPartition, int], dict[TopicPartition, int]]

#: Changelogs of tables fed by every source partition number (co-partitioned).
CHANGELOGS = ("streamstate-word_counts-changelog", "streamstate-inventory-changelog")
#: The stretch at the end of the first hold whose longest stall is the steady state's.
STEADY_S = 6.0
#: The targets of the issue: the longest stall of a partition that stays, of one that moves.
STAYED_TARGET_S = 0.5
MOVED_TARGET_S = 1.0


@dataclass(frozen=True)
class ScalePlan:
    guarantee: str
    rounds: int = 3
    #: Load before the first step, and after each step once the assignment settled.
    hold_s: float = 10.0
    #: How long a step may take to show its new assignment in the group's metadata.
    assignment_timeout_s: float = 60.0
    ready_timeout_s: float = 120.0
    seed: int = 11

    @property
    def active_s(self) -> float:
        return self.hold_s + self.rounds * 2 * (self.hold_s + 10.0)


class PartitionWatch(LagMonitor):
    """A lag monitor that also keeps each input partition's offsets at every sample."""

    def __init__(self, bootstrap: str, interval: float = 0.2) -> None:
        super().__init__(bootstrap, interval)
        self.offsets: list[Offsets] = []

    async def _sample(self, consumer: AIOKafkaConsumer, admin: AIOKafkaAdminClient) -> Any:
        at = time.monotonic()
        if {tp.topic for tp in consumer.assignment()} != set(INPUTS):
            watch_only(consumer, await self._partitions())
        # committed first, then the ends: see LagMonitor._sample
        committed = await committed_offsets(admin, GROUP)
        found = await consumer.end_offsets(list(consumer.assignment()))
        ends = {(tp.topic, tp.partition): end for tp, end in found.items()}
        self.offsets.append((at, dict(committed), ends))
        return sample_of(at, ends, committed)


def longest_stalls(
    samples: Sequence[Offsets], start: float, end: float
) -> dict[TopicPartition, float]:
    """Per input partition, the longest time in ``[start, end]`` its committed offset
    stood still while records waited behind it. A stall runs from the first sample that
    saw the offset with records waiting to the first sample that saw it move, or to the
    window's last sample when it never moved."""
    window = [s for s in samples if start <= s[0] <= end]
    longest: dict[TopicPartition, float] = {}
    since: dict[TopicPartition, tuple[float, int]] = {}
    for at, committed, ends in window:
        for tp, last in ends.items():
            offset = committed.get(tp, 0)
            longest.setdefault(tp, 0.0)
            held = since.get(tp)
            if held is not None and held[1] != offset:
                longest[tp] = max(longest[tp], at - held[0])
                held = None
                del since[tp]
            if held is None and last > offset:
                since[tp] = (at, offset)
    if window:
        last_at = window[-1][0]
        for tp, (began, _) in since.items():
            longest[tp] = max(longest[tp], last_at - began)
    return longest


def owners(metadata: Mapping[str, Any], topics: Iterable[str]) -> dict[int, str]:
    """Partition number -> the URL of the worker holding it actively, from ``/metadata``
    (the topics are co-partitioned: one worker holds partition p of all of them)."""
    wanted = set(topics)
    found: dict[int, str] = {}
    for host in metadata.get("hosts", []):
        for topic, partitions in (host.get("active") or {}).items():
            if topic in wanted:
                for partition in partitions:
                    found[int(partition)] = str(host["url"]).rstrip("/")
    return found


def moved(before: Mapping[int, str], after: Mapping[int, str]) -> set[int]:
    """The partitions whose active owner changed (or that had none on one side)."""
    return {p for p in set(before) | set(after) if before.get(p) != after.get(p)}


def split_stalls(
    stalls: Mapping[TopicPartition, float], moved_partitions: set[int], partitions: int
) -> dict[str, Any]:
    """One step's stalls by partition number (the longest over the topics), split into the
    partitions that stayed and those that moved."""
    per_partition: dict[int, float] = {p: 0.0 for p in range(partitions)}
    for (_topic, partition), seconds in stalls.items():
        if partition in per_partition:
            per_partition[partition] = max(per_partition[partition], seconds)
    stayed = {p: round(s, 2) for p, s in per_partition.items() if p not in moved_partitions}
    went = {p: round(s, 2) for p, s in per_partition.items() if p in moved_partitions}
    by_topic: dict[str, dict[str, float]] = {"stayed": {}, "moved": {}}
    for (topic, partition), seconds in stalls.items():
        kind = by_topic["moved" if partition in moved_partitions else "stayed"]
        kind[topic] = round(max(kind.get(topic, 0.0), seconds), 2)
    return {
        "stayed": stayed,
        "moved": went,
        "by_topic": by_topic,
        "stayed_max_s": max(stayed.values()) if stayed else None,
        "moved_max_s": max(went.values()) if went else None,
    }


def run(kafka: LocalKafka, plan: ScalePlan, level: LoadLevel) -> dict[str, Any]:
    """Run ``plan`` at ``level`` on ``kafka``, whose topics are deleted first."""
    reset(kafka)
    work = workdir(f"scale-{plan.guarantee}")
    session = Session(kafka, level, work, active_s=plan.active_s, seed=plan.seed)
    watch = PartitionWatch(kafka.bootstrap)
    watch.start()
    try:
        with group(kafka, work, PROCESSING_GUARANTEE=plan.guarantee) as workers:
            figures = ScaleRun(plan, session, workers, watch).run()
    finally:
        watch.stop()
        load = session.close()
    figures["load"] = load
    figures["watch"] = {**watch.summary(), "interval_s": watch.interval}
    return figures


class ScaleRun:
    """The rounds of one plan against one group."""

    def __init__(
        self, plan: ScalePlan, session: Session, workers: Group, watch: PartitionWatch
    ) -> None:
        self.plan = plan
        self.session = session
        self.group = workers
        self.watch = watch
        self.lasting = [workers.add(f"w{n}") for n in range(2)]
        for worker in self.lasting:
            worker.wait_ready(240)
        self.third: Worker | None = None
        self.probe: ReadProbe | None = None
        self.steps: list[dict[str, Any]] = []
        self.steady_stall_s: float | None = None

    def run(self) -> dict[str, Any]:
        self.session.start_load()
        try:
            time.sleep(self.plan.hold_s)
            # The floor of the figures: the longest stall of the steady state before any
            # step (the end of the hold, the group settled), as the batch cycles pace the
            # commits under this load.
            now = time.monotonic()
            steady = longest_stalls(self.watch.offsets, now - STEADY_S, now)
            self.steady_stall_s = round(max(steady.values()), 2) if steady else None
            self._start_probe()
            for number in range(1, self.plan.rounds + 1):
                self.steps.append(self.scale_out(number))
                self.steps.append(self.scale_in(number))
            self.session.pause()
            settled = self.session.settle()
        finally:
            if self.probe is not None:
                self.probe.stop()
        return self.summary(settled.drift.as_dict(), settled.drain_s)

    # -- the steps ----------------------------------------------------------------------

    def scale_out(self, number: int) -> dict[str, Any]:
        before = self._owners()
        began = time.monotonic()
        if self.third is None:
            self.third = self.group.add("w2")
        else:
            self.third.start()
        ready, failure = wait_ready(self.third, self.plan.ready_timeout_s)
        after = self._settled(lambda found: self.third is not None and self._holds(found))
        if self.probe is not None and failure is None:
            self.probe.fronts = [*self.lasting, self.third]
        return self._step(number, "out", before, after, began, ready, failure)

    def scale_in(self, number: int) -> dict[str, Any]:
        assert self.third is not None
        before = self._owners()
        if self.probe is not None:
            self.probe.avoid(self.third)
        began = time.monotonic()
        clean = self.third.stop()
        stopped = time.monotonic()
        after = self._settled(lambda found: not self._holds(found) and len(found) == 8)
        row = self._step(number, "in", before, after, began, stopped, None)
        row["stopped_cleanly"] = clean
        return row

    def _step(
        self,
        number: int,
        kind: str,
        before: dict[int, str],
        after: dict[int, str] | None,
        began: float,
        ready: float | None,
        failure: str | None,
    ) -> dict[str, Any]:
        settled_at = time.monotonic()
        time.sleep(self.plan.hold_s)
        ended = time.monotonic()
        stalls = longest_stalls(self.watch.offsets, began, ended)
        went = moved(before, after or {})
        split = split_stalls(stalls, went, 8)
        reads = self._reads(began, ended)
        row = {
            "round": number,
            "step": kind,
            "workers_after": 3 if kind == "out" else 2,
            "assignment_settled": after is not None,
            "assignment_s": round(settled_at - began, 2),
            "ready_s": None if ready is None else round(ready - began, 2),
            "failure": failure,
            "moved_partitions": sorted(went),
            "samples": len([s for s in self.watch.offsets if began <= s[0] <= ended]),
            **split,
            **reads,
        }
        print(
            f"chaos: scale round {number} {kind}: moved {sorted(went)}, longest stall stayed "
            f"{split['stayed_max_s']} s, moved {split['moved_max_s']} s; reads failed "
            f"{reads['reads_failed']}/{reads['reads']}",
            flush=True,
        )
        return row

    def _owners(self) -> dict[int, str]:
        for worker in self.lasting:
            try:
                status, body = worker.get("/metadata", timeout=5.0)
            except OSError:
                continue
            if status == 200 and isinstance(body, dict):
                return owners(body, CHANGELOGS)
        return {}

    def _holds(self, found: Mapping[int, str]) -> bool:
        return self.third is not None and self.third.url in found.values()

    def _settled(self, done: Any) -> dict[int, str] | None:
        """The assignment once ``done`` holds of it and every partition has an owner."""
        deadline = time.monotonic() + self.plan.assignment_timeout_s
        while time.monotonic() < deadline:
            found = self._owners()
            if len(found) == 8 and done(found):
                return found
            time.sleep(0.2)
        return None

    def _start_probe(self, timeout: float = 120.0) -> None:
        sampled = keys_to_read(self.session.tables, timeout)
        self.probe = ReadProbe(sampled, self.lasting, pace_s=0.02).start()

    def _reads(self, start: float, end: float) -> dict[str, Any]:
        if self.probe is None:
            return {"reads": 0, "reads_failed": 0, "read_p99_ms": None}
        answers = [a for a in self.probe.answers if start <= a.at <= end]
        failed = [a for a in answers if a.status != 200]
        return {
            "reads": len(answers),
            "reads_failed": len(failed),
            "reads_failed_examples": [a.describe() for a in failed[:3]],
            "read_p99_ms": p99_ms([a.seconds for a in answers if a.seconds is not None]),
        }

    # -- the summary --------------------------------------------------------------------

    def summary(self, drift: dict[str, Any], drain_s: float | None) -> dict[str, Any]:
        steps = self.steps
        stayed = [s["stayed_max_s"] for s in steps if s["stayed_max_s"] is not None]
        went = [s["moved_max_s"] for s in steps if s["moved_max_s"] is not None]
        reads = sum(s["reads"] for s in steps)
        latencies = [
            a.seconds
            for a in (self.probe.answers if self.probe is not None else [])
            if a.seconds is not None
        ]
        return {
            "guarantee": self.plan.guarantee,
            "rounds_planned": self.plan.rounds,
            "steps": [{k: v for k, v in s.items()} for s in steps],
            "steps_settled": sum(1 for s in steps if s["assignment_settled"]),
            "steps_with_moves": sum(1 for s in steps if s["moved_partitions"]),
            "steady_longest_stall_s": self.steady_stall_s,
            "stayed_longest_stall_s": max(stayed) if stayed else None,
            "moved_longest_stall_s": max(went) if went else None,
            "reads": reads,
            "reads_failed": sum(s["reads_failed"] for s in steps),
            "read_p99_ms": p99_ms(latencies),
            "failures": [s["failure"] for s in steps if s["failure"]],
            "agent_crashes": sum(crashes(w) for w in self.group.workers),
            "losses": self.session.losses(),
            "drift": drift,
            "drain_after_pause_s": drain_s,
        }


def p99_ms(seconds: Sequence[float]) -> float | None:
    """The 99th percentile of ``seconds``, in ms (nearest rank)."""
    if not seconds:
        return None
    ordered = sorted(seconds)
    rank = max(0, math.ceil(0.99 * len(ordered)) - 1)
    return round(ordered[rank] * 1000, 1)


def headline(r: dict[str, Any]) -> str:
    exact = "every table exact" if r["drift"]["exact"] else "**not exact**"
    return (
        f"{r['rounds_planned']} rounds of 2 -> 3 -> 2 workers ({r['guarantee']}): longest "
        f"stall {r['stayed_longest_stall_s']} s for partitions that stayed, "
        f"{r['moved_longest_stall_s']} s for those that moved (steady state before the "
        f"first step: {r.get('steady_longest_stall_s')} s); reads failed "
        f"{r['reads_failed']}/{r['reads']}, p99 {r['read_p99_ms']} ms; {exact}"
    )


HOW = __doc__ or ""
