"""What each scenario must show, as named checks over its figures.

The runner writes them to the summary; the integration tests assert them. Every check
compares a measured figure with what the contract or the issue asks, so each can fail;
where a figure could be vacuous (no sample taken, nothing acknowledged), the check
also asks for that figure to be there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: Restart to ready, and failover to every key active elsewhere, at most this long.
BACK_IN_S = 5.0
#: The load generator must have offered at least this share of the planned rates.
OFFERED_SHARE = 0.95
#: While a broker node is down, the group must process at least this share of what is
#: offered meanwhile (the full run offers half of what it sustains).
KEPT_UP_SHARE = 0.5
TABLES = ("word_counts", "inventory", "sales_by_category", "unsettled_sales", "settled-sales")


@dataclass(frozen=True)
class Check:
    """One named property of a scenario's figures. A *target* is a figure the issue
    asks for (a time to be back, say) rather than a guarantee of the contract: a missed
    target shows in the verdict without failing the run."""

    what: str
    ok: bool
    target: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {"check": self.what, "ok": self.ok, "target": self.target}


def verdict(checks: list[Check], figures: dict[str, Any] | None = None) -> str:
    """The scenario's verdict: skipped, fail (a guarantee failed), target missed, pass."""
    if figures is not None and figures.get("skipped"):
        return "skipped"
    if not checks or any(not c.ok and not c.target for c in checks):
        return "fail"
    return "target missed" if any(not c.ok for c in checks) else "pass"


def offered(
    load: dict[str, Any], rates: dict[str, Any] | None = None, when: str = "wall time"
) -> list[Check]:
    """The generator offered the planned rates of lines and item events: records
    acknowledged over the wall time it was asked to offer (``rates``: over part of it),
    its stalls included."""
    level, rates = load["level"], rates if rates is not None else load
    lines = (rates.get("offered_lines_per_s") or 0) >= OFFERED_SHARE * level["lines_per_s"]
    events = (rates.get("offered_events_per_s") or 0) >= OFFERED_SHARE * level["events_per_s"]
    return [
        Check(
            f"offered at least {OFFERED_SHARE:.0%} of {level['lines_per_s']:,.0f} lines/s and "
            f"{level['events_per_s']:,.0f} item events/s (acknowledged, over {when})",
            lines and events,
        )
    ]


def no_loss(r: dict[str, Any]) -> list[Check]:
    return [
        Check(
            "every acknowledged record is in its topic at its offset",
            r["acked_records"] > 0 and r["acked_but_lost"] == 0,
        ),
        Check("no record written twice to a source topic", r["records_out_of_sequence"] == 0),
    ]


def compared(drift: dict[str, Any] | None, what: str) -> list[Check]:
    """The comparison meant something: the truth holds keys of every table, and every
    traced record (a key of its own: no duplicate of another record makes up for its
    loss) has its effect."""
    tables = [drift.get(name) or {} for name in TABLES] if drift else []
    traced = sum(t.get("traced", 0) for t in tables)
    lost = sum(t.get("traced_lost", 0) for t in tables)
    return [
        Check(
            "the ground truth holds keys of every table compared",
            bool(tables) and all(t.get("keys_expected", 0) > 0 for t in tables),
        ),
        Check(
            f"no traced record lost {what} ({traced:,} traced keys, each fed by one record)",
            traced > 0 and lost == 0,
        ),
    ]


def exact(drift: dict[str, Any], what: str) -> Check:
    return Check(f"every table and settled-sales equal the ground truth {what}", drift["exact"])


def not_under(drift: dict[str, Any], what: str) -> Check:
    return Check(
        f"no table under-counted {what}", all(drift[name]["under"] == 0 for name in TABLES)
    )


def kill_worker(r: dict[str, Any]) -> list[Check]:
    eos = r["guarantee"] == "exactly_once"
    found = [
        Check(
            f"{r['kills_planned']} kills -9 spread over {r['workers']} workers",
            r["kills"] == r["kills_planned"] and len(r["victims"]) == min(r["workers"], r["kills"]),
        ),
        Check("no agent crashed", r["agent_crashes"] == 0),
        Check("every restarted worker became ready", not r["restart_failures"]),
        Check(
            f"restart to ready in at most {BACK_IN_S:g} s after every kill",
            bool(r["restart_to_ready_s"])
            and all(s is not None and s <= BACK_IN_S for s in r["restart_to_ready_s"]),
            target=True,
        ),
        Check(
            "no key read failed while workers were killed and restarted",
            r["reads_during_kills"] > 0 and r["reads_failed_during_kills"] == 0,
        ),
        Check(
            "no table under-counted after any kill",
            all(n == 0 for n in r["under_count_total"].values()),
        ),
        *compared(r["final_drift"], "after the kills"),
        *no_loss(r["losses"]),
        *offered(r["load"]),
    ]
    copies = r.get("local_copies")
    if copies is not None:
        found.append(
            Check(
                "every up-to-date copy on disk equals its changelog "
                f"({copies['copies_compared']} compared)",
                copies["copies_compared"] > 0 and copies["exact"],
            )
        )
    if eos:
        found.append(Check("every table exact after every kill -9", r["exact_after_every_kill"]))
        found.append(
            Check(
                "no duplicate in settled-sales",
                all(n == 0 for n in r["over_count_per_kill"]["settled-sales"]),
            )
        )
    if r["clean_stop_adds_drift"] is not None:
        found.append(Check("a clean stop (SIGTERM) adds no drift", not r["clean_stop_adds_drift"]))
    if r.get("failover") is not None:
        found += _failover(r["failover"], eos)
    if r.get("batch_job") is not None:
        found.append(_nightly(r["batch_job"]))
    return found


def _failover(f: dict[str, Any], eos: bool) -> list[Check]:
    seconds = f["seconds_to_active"]
    found = [
        Check(
            f"failover: every sampled key answered by an active copy elsewhere within "
            f"{BACK_IN_S:g} s",
            seconds is not None and seconds <= BACK_IN_S,
            target=True,
        ),
        Check(
            "failover: no key read failed meanwhile",
            f["reads"] > 0 and f["failed_reads"] == 0 and f["probe_reads_failed"] == 0,
        ),
    ]
    if eos:
        found.append(Check("failover: every table exact afterwards", f["exact_after"]))
    else:
        under = [f[f"{name}_under_added"] for name in TABLES]
        found.append(Check("failover: no table under-counted", all(n == 0 for n in under)))
    return found


def _nightly(batch: dict[str, Any]) -> Check:
    return Check(
        "the nightly job finds exactly the keys left wrong (word_counts, inventory, sales)",
        bool(batch.get("ran")) and bool(batch.get("same_keys")),
    )


def broker_loss(r: dict[str, Any]) -> list[Check]:
    level, down = r["load"]["level"], r["offered_while_down"]
    processed = r["processed_while_down"]
    kept_up = [
        (r["processed_lines_per_s_while_down"], down["offered_lines_per_s"]),
        (r["processed_events_per_s_while_down"], down["offered_events_per_s"]),
    ]
    return [
        Check("topics have replication factor 3", min(r["replication_factor"].values()) == 3),
        Check(
            f"producing (acks=all) went on while the node was down: at least "
            f"{OFFERED_SHARE:.0%} of the planned rates acknowledged",
            (down["offered_lines_per_s"] or 0) >= OFFERED_SHARE * level["lines_per_s"]
            and (down["offered_events_per_s"] or 0) >= OFFERED_SHARE * level["events_per_s"],
        ),
        Check(
            f"processing went on while the node was down: at least {KEPT_UP_SHARE:.0%} of "
            "the offered lines and item events per second",
            all(n is not None and n > 0 for n in processed.values())
            and all(
                done is not None and offered is not None and done >= KEPT_UP_SHARE * offered
                for done, offered in kept_up
            ),
        ),
        Check("workers not restarted", r["workers_same_process"]),
        Check("no agent crashed", r["agent_crashes"] == 0),
        Check("caught up once the load paused", r["drain_after_pause_s"] is not None),
        exact(r["drift"], "after catch-up"),
        *compared(r["drift"], "after catch-up"),
        *no_loss(r),
        *offered(r["load"]),
    ]


def broker_outage(r: dict[str, Any]) -> list[Check]:
    enough = (r["broker_down_s"] - 2) * r["workers"]
    return [
        Check("workers not restarted", r["workers_same_process"]),
        Check("no agent crashed", r["agent_crashes"] == 0),
        Check(
            "/health answered 200 throughout", r["samples"] > 0 and r["health_200"] == r["samples"]
        ),
        Check(
            "/ready answered 503 with a reason in every sample from the first second on",
            r["samples_from_first_second"] >= enough
            and r["ready_503_with_reason"] == r["samples_from_first_second"],
        ),
        Check(
            "ready again after the broker came back",
            all(s is not None for s in r["ready_again_after_s"]),
        ),
        Check("caught up once the load paused", r["drain_after_pause_s"] is not None),
        exact(r["drift"], "after catch-up"),
        *compared(r["drift"], "after catch-up"),
        *no_loss(r),
        *offered(r["load"], r["offered_before_outage"], "the wall time before the outage"),
    ]


def disk(r: dict[str, Any]) -> list[Check]:
    if r.get("skipped"):
        return []
    eos = r["guarantee"] == "exactly_once"
    report, offsets = r["report"], r["offsets"]
    found = [
        Check(
            "/ready answered 503 failed",
            report.get("ready") == 503 and report.get("status") == "failed",
        ),
        Check("/metrics said streamstate_engine_failed 1", report.get("metric") == 1),
        Check("the worker process stayed up", r["worker_alive_after_fault"]),
        Check(
            "nothing more committed for its partitions after it failed",
            bool(r["partitions_of_the_worker"]) and not r["committed_moved_after_report"],
        ),
        Check("restarted once the disk had room", r["restart_failed"] is None),
        Check("no agent crashed", r["agent_crashes"] == 0),
        *compared(r["drift"], "after the restart and catch-up"),
        *no_loss(r),
        *offered(r["load"]),
    ]
    if eos:
        found.append(
            Check(
                "committed offsets not past what the changelogs hold",
                offsets["compared"] > 0 and offsets["committed_past_changelog"] == 0,
            )
        )
        found.append(exact(r["drift"], "after the restart and catch-up"))
    else:
        found.append(
            Check(
                "committed offsets not past what its stores hold",
                offsets["compared"] > 0 and offsets["committed_past_store"] == 0,
            )
        )
        found.append(not_under(r["drift"], "after the restart and catch-up"))
    return found


def bad_input(r: dict[str, Any]) -> list[Check]:
    per = r["per_topic"].values()
    return [
        Check("at least 1,000 malformed records", r["records"] >= 1000),
        Check("100% in the dead-letter topics", r["in_dlq"] == r["records"]),
        Check("each dead-lettered once", all(p["duplicates"] == 0 for p in per)),
        Check("each with an error header", all(p["without_error_header"] == 0 for p in per)),
        Check("original key and value kept", all(p["not_the_original_bytes"] == 0 for p in per)),
        Check("zero agent restarts", r["agent_crashes"] == 0 and r["worker_alive"]),
        Check("tables unchanged", not r["tables_changed"]),
    ]


def api_fuzz(r: dict[str, Any], min_cases: int = 1000) -> list[Check]:
    return [
        Check(f"at least {min_cases} generated cases", r["cases"] >= min_cases),
        Check("zero 5xx", r["server_errors"] == 0),
        Check(
            "Hypothesis generated every operation's cases without an error of its own",
            r["generation_error_count"] == 0,
        ),
        Check(
            "every hostile request answered and refused",
            r["refusal_checks"] > 0 and not r["refusal_failures"],
        ),
        Check("no connection to a host a request named", r["trap_connections"] == 0),
        Check("workers alive, no agent crashed", r["workers_alive"] and r["agent_crashes"] == 0),
    ]


def lost_disk(r: dict[str, Any]) -> list[Check]:
    return [
        Check(
            "the workload filled word_counts and inventory",
            r["keys"]["word_counts"] > 0 and r["keys"]["inventory"] > 0,
        ),
        Check("tables equal before and after, at the first ready", r["equal_at_ready"]),
        Check(
            "every changelog record restored",
            r["changelog_records"] > 0 and r["records_restored"] == r["changelog_records"],
        ),
        Check("no agent crashed", r["agent_crashes"] == 0),
    ]


#: The longest stall the issue allows a partition that stays with its owner, one that moves.
STAYED_STALL_S = 0.5
MOVED_STALL_S = 1.0


def scale(r: dict[str, Any]) -> list[Check]:
    """Scaling a group out and in under load: every step done, both kinds of partition
    measured, reads answered, tables exact."""
    steps = r["steps"]
    stayed, moved = r["stayed_longest_stall_s"], r["moved_longest_stall_s"]
    return [
        Check(
            f"{r['rounds_planned']} rounds of scaling out to 3 workers and in to 2, each "
            "step's new assignment seen in the group's metadata",
            len(steps) == 2 * r["rounds_planned"]
            and r["steps_settled"] == len(steps)
            and not r["failures"],
        ),
        Check(
            "every step moved some partitions and kept others, each sampled",
            bool(steps)
            and r["steps_with_moves"] == len(steps)
            and all(s["stayed"] and s["samples"] > 0 for s in steps),
        ),
        Check(
            f"partitions that stayed stalled at most {STAYED_STALL_S:g} s",
            stayed is not None and stayed <= STAYED_STALL_S,
            target=True,
        ),
        Check(
            f"partitions that moved stalled at most {MOVED_STALL_S:g} s",
            moved is not None and moved <= MOVED_STALL_S,
            target=True,
        ),
        Check(
            "no key read failed while the group scaled",
            r["reads"] > 0 and r["reads_failed"] == 0,
        ),
        Check("no agent crashed", r["agent_crashes"] == 0),
        exact(r["drift"], "after the last step and catch-up"),
        *compared(r["drift"], "after the last step"),
        *no_loss(r["losses"]),
        *offered(r["load"]),
    ]
