"""kill -9 of workers under sustained load, round after round; a clean stop; a failover.

Three workers process the load (chaos/load.py) while, each round, one of them is killed
with SIGKILL at a random moment and started again at once on the same data dir; the load
goes on through the restart, then pauses: the group catches up and every table (and
``settled-sales``) is compared with the ground truth from the source topics. What a round
adds to a table's drift is that kill's over-count (or under-count). The victims rotate
over the workers. A round with SIGTERM instead shows the clean case; then one worker is
killed and not restarted: the failover, with key reads through the survivors all along.
"""

from __future__ import annotations

import random
import sys
import time
from dataclasses import dataclass
from typing import Any

from chaos.compare import TABLES, Drift
from chaos.env import (
    Group,
    cpu_seconds,
    crashes,
    evictions,
    group,
    pid,
    reset,
    restart_phases,
    wait_ready,
    workdir,
)
from chaos.lag import LagMonitor
from chaos.load import LoadFigures, LoadLevel
from chaos.nightly import batch_report
from chaos.probe import ReadProbe, failover, keys_to_read
from chaos.replicas import audit, read_copies
from chaos.session import Session, Settled
from tests.support.kafka import LocalKafka
from tests.support.workers import Worker

#: The tables compared, and the settled pairs.
COMPARED = (*TABLES, "settled-sales")
#: Every table the workers keep on disk (the settling join's state included).
STATE_TABLES = (*TABLES, "settling_buffer", "settling_index")


@dataclass(frozen=True)
class KillPlan:
    guarantee: str
    kills: int = 10
    workers: int = 3
    load_before_kill_s: tuple[float, float] = (6.0, 12.0)
    load_after_ready_s: float = 8.0
    clean_stop: bool = True
    failover: bool = True
    seed: int = 7
    #: Run the nightly job at the end and compare its report with the measured drift.
    batch_check: bool = False
    ready_timeout_s: float = 120.0

    @property
    def active_s(self) -> float:
        """About how long the load runs, for the event clock."""
        # a restart under load takes 10 to 20 s here
        per_round = sum(self.load_before_kill_s) / 2 + 15.0 + self.load_after_ready_s
        return (self.kills + int(self.clean_stop) + int(self.failover)) * per_round


def run(kafka: LocalKafka, plan: KillPlan, level: LoadLevel) -> dict[str, Any]:
    """Run ``plan`` at ``level`` on ``kafka``, whose topics are deleted first."""
    reset(kafka)
    work = workdir(f"kill-{plan.guarantee}")
    session = Session(kafka, level, work, active_s=plan.active_s, seed=plan.seed)
    try:
        with group(kafka, work, PROCESSING_GUARANTEE=plan.guarantee) as workers:
            figures = KillRun(plan, session, workers).run()
            if plan.batch_check:
                drift = session.compare()
                figures["batch_job"] = batch_report(kafka, work / "recompute", drift)
        # The group has stopped: every worker's copies on disk against the changelogs.
        figures["local_copies"] = local_copies(kafka, workers.workers)
    finally:
        load = session.close()
    figures["load"] = load
    return figures


def local_copies(kafka: LocalKafka, workers: list[Worker]) -> dict[str, Any]:
    """The audit of every table partition the stopped ``workers`` hold on disk."""
    copies = read_copies([(w.datadir.name, w.datadir) for w in workers], STATE_TABLES)
    changelogs = {table: f"streamstate-{table}-changelog" for table in STATE_TABLES}
    return audit(kafka.bootstrap, copies, changelogs).as_dict()


class KillRun:
    """The rounds of one plan against one group."""

    def __init__(self, plan: KillPlan, session: Session, workers: Group) -> None:
        self.plan = plan
        self.session = session
        self.monitor: LagMonitor = session.monitor
        self.rng = random.Random(plan.seed)
        self.members = [workers.add(f"w{n}") for n in range(plan.workers)]
        for worker in self.members:
            worker.wait_ready(240)
        self.rounds: list[dict[str, Any]] = []
        self.previous: Drift | None = None
        #: at_least_once may over-count after a kill: a stable drift has settled.
        self.drifts = plan.guarantee == "at_least_once"
        self.probe: ReadProbe | None = None

    def run(self) -> dict[str, Any]:
        self.session.start_load()
        kinds = ["kill9"] * self.plan.kills + (["sigterm"] if self.plan.clean_stop else [])
        try:
            for number, kind in enumerate(kinds, 1):
                row = self.round(number, kind, self.members[(number - 1) % len(self.members)])
                self.rounds.append(row)
                if row["restart_failed"]:
                    break  # the worker cannot start again: the rounds end here
            failed = any(r["restart_failed"] for r in self.rounds)
            gone = self.failover() if self.plan.failover and not failed else None
        finally:
            if self.probe is not None:
                self.probe.stop()
        return self.summary(gone)

    # -- one round --------------------------------------------------------------------

    def round(self, number: int, kind: str, victim: Worker) -> dict[str, Any]:
        begun = time.monotonic()
        before = self._resume(number)
        time.sleep(self.rng.uniform(*self.plan.load_before_kill_s))
        self._start_probe()
        assert self.probe is not None
        self.probe.avoid(victim)
        killed, killed_wall = time.monotonic(), time.time()
        lag_before = self.monitor.lag_at(killed)
        if kind == "kill9":
            victim.kill9()
        else:
            victim.stop()
        restarted, restarted_wall = time.monotonic(), time.time()
        victim.start()
        ready, failure = wait_ready(victim, self.plan.ready_timeout_s)
        cpu = cpu_seconds(pid(victim)) if ready is not None else None
        phases = restart_phases(victim, restarted_wall) if ready is not None else {}
        self._fronts(self.members)
        if ready is not None:
            time.sleep(self.plan.load_after_ready_s)
        after = self.session.pause()
        paused = time.monotonic()
        settled = self.session.settle(drifts=self.drifts)
        row = {
            "round": number,
            "fault": kind,
            "victim": victim.datadir.name,
            "restart_to_ready_s": None if ready is None else round(ready - restarted, 2),
            "kill_to_ready_s": None if ready is None else round(ready - killed, 2),
            "restart_cpu_s": cpu,
            **phases,
            "evicted": evictions(
                [w for w in self.members if w is not victim], victim.url, killed_wall
            ),
            **self._load_row(before, after, begun, paused),
            **self._lag_row(lag_before, begun, ready, paused, settled),
            **self._reads_row(killed, paused),
            **self._drift_row(settled.drift),
            "restart_failed": failure,
        }
        self.previous = settled.drift
        print(
            f"chaos: {self.plan.guarantee} round {number} ({kind} {row['victim']}): ready "
            f"after {row['restart_to_ready_s']} s, drained {row['drain_after_pause_s']} s, "
            f"exact {row['exact']}",
            file=sys.stderr,
            flush=True,
        )
        return row

    def _resume(self, number: int) -> LoadFigures:
        load = self.session.load
        assert load is not None
        if number > 1:
            self.session.resume()
        return load.figures

    def _start_probe(self, timeout: float = 120.0) -> None:
        """Reads begin once the tables have keys (after the first stretch of load; on a
        busy machine the group may take a while to write its first ones)."""
        if self.probe is not None:
            return
        sampled = keys_to_read(self.session.tables, timeout)
        self.probe = ReadProbe(sampled, self.members).start()

    def _fronts(self, workers: list[Worker]) -> None:
        if self.probe is not None:
            self.probe.fronts = list(workers)

    def _load_row(
        self, before: LoadFigures, after: LoadFigures, begun: float, paused: float
    ) -> dict[str, Any]:
        offered = after.since(before)
        return {
            "load_s": offered["running_s"],
            "offered_lines_per_s": offered["offered_lines_per_s"],
            "offered_events_per_s": offered["offered_events_per_s"],
            "offered_payments_per_s": offered["offered_payments_per_s"],
            "generator_stalled_s": offered["stalled_s"],
            "processed_lines_per_s": self._rate("text-lines", begun, paused),
            "processed_events_per_s": self._rate("item-events", begun, paused),
        }

    def _rate(self, topic: str, start: float, end: float) -> float | None:
        found = self.monitor.processed(topic, start, end)
        return None if found is None or found[1] <= 0 else round(found[0] / found[1])

    def _lag_row(
        self,
        lag_before: int | None,
        begun: float,
        ready: float | None,
        paused: float,
        settled: Settled,
    ) -> dict[str, Any]:
        """Peak lag; how soon after the restart the lag fell back to where it was before
        the kill while the load still ran (None: not before the pause); the drain after
        the pause."""
        back = None
        if ready is not None and lag_before is not None:
            at = self.monitor.first_at_most(lag_before, ready)
            back = None if at is None or at > paused else round(at - ready, 1)
        end = settled.caught_up_at or time.monotonic()
        return {
            "lag_before_kill": lag_before,
            "peak_lag": self.monitor.peak_lag(begun, end),
            "back_to_lag_before_s": back,
            "drain_after_pause_s": settled.drain_s,
        }

    def _reads_row(self, start: float, end: float) -> dict[str, Any]:
        if self.probe is None:
            return {"reads": 0, "reads_failed": 0}
        failed = self.probe.failed(start, end)
        return {
            "reads": self.probe.count(start, end),
            "reads_failed": len(failed),
            "reads_failed_examples": [a.describe() for a in failed[:3]],
        }

    def _drift_row(self, now: Drift) -> dict[str, Any]:
        row: dict[str, Any] = {"exact": now.exact}
        for name in COMPARED:
            table, before = now.tables[name], self.previous.tables[name] if self.previous else None
            row[f"{name}_over_added"] = table.over - (before.over if before else 0)
            row[f"{name}_under_added"] = table.under - (before.under if before else 0)
        row["drift"] = now.as_dict()
        return row

    # -- failover ---------------------------------------------------------------------

    def failover(self) -> dict[str, Any]:
        """Kill one worker for good under load; read every sampled key through the
        survivors until actives elsewhere answer them all; then compare the tables."""
        self.session.resume()
        time.sleep(self.rng.uniform(*self.plan.load_before_kill_s))
        victim = self.members[-1]
        survivors = [w for w in self.members if w is not victim]
        assert self.probe is not None
        self.probe.avoid(victim)
        killed = time.monotonic()
        victim.kill9()
        found = failover(survivors, self.probe.keys, victim.url, killed)
        time.sleep(self.plan.load_after_ready_s)
        self.session.pause()
        settled = self.session.settle(drifts=self.drifts)
        found.update(
            victim=victim.datadir.name,
            probe_reads_failed=len(self.probe.failed(killed, time.monotonic())),
            exact_after=settled.drift.exact,
            drain_after_pause_s=settled.drain_s,
            **{k: v for k, v in self._drift_row(settled.drift).items() if k != "drift"},
        )
        self.previous = settled.drift
        return found

    # -- the summary ------------------------------------------------------------------

    def summary(self, gone: dict[str, Any] | None) -> dict[str, Any]:
        kills = [r for r in self.rounds if r["fault"] == "kill9"]
        clean = [r for r in self.rounds if r["fault"] == "sigterm"]
        last = self.previous
        return {
            "guarantee": self.plan.guarantee,
            "workers": self.plan.workers,
            "kills_planned": self.plan.kills,
            "kills": len(kills),
            "victims": sorted({r["victim"] for r in kills}),
            "restart_to_ready_s": [r["restart_to_ready_s"] for r in kills],
            "kill_to_ready_s": [r["kill_to_ready_s"] for r in kills],
            "over_count_per_kill": {
                name: [r[f"{name}_over_added"] for r in kills] for name in COMPARED
            },
            "under_count_total": {
                name: last.tables[name].under if last else None for name in COMPARED
            },
            "exact_after_every_kill": bool(kills) and all(r["exact"] for r in kills),
            "clean_stop_adds_drift": any(
                r[f"{n}_over_added"] or r[f"{n}_under_added"] for r in clean for n in COMPARED
            )
            if clean
            else None,
            "reads_during_kills": sum(r["reads"] for r in self.rounds),
            "reads_failed_during_kills": sum(r["reads_failed"] for r in self.rounds),
            "failover": gone,
            "losses": self.session.losses(),
            "agent_crashes": sum(crashes(w) for w in self.members),
            "restart_failures": [r["restart_failed"] for r in self.rounds if r["restart_failed"]],
            "final_drift": last.as_dict() if last else None,
            "rounds": [{k: v for k, v in r.items() if k != "drift"} for r in self.rounds],
        }
