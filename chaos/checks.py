"""What each scenario must show, as named checks over its figures.

The runner writes them to the summary; the integration tests assert them. Every check
can fail, and a failed check fails the scenario.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Check:
    what: str
    ok: bool

    def as_dict(self) -> dict[str, Any]:
        return {"check": self.what, "ok": self.ok}


def verdict(checks: list[Check]) -> str:
    return "pass" if all(c.ok for c in checks) else "fail"


def kill_worker(r: dict[str, Any]) -> list[Check]:
    eos = r["guarantee"] == "exactly_once"
    checks = [
        Check("no agent crashed", r["agent_crashes"] == 0),
        Check("every restarted worker became ready", not r["restart_failures"]),
        Check("no word under-counted after any kill", r["under_count_total"] == 0),
        Check("a clean stop (SIGTERM) adds no drift", r["clean_stop_adds_drift"] is False),
    ]
    batch = r.get("batch_job")
    if batch is not None:
        checks.append(
            Check(
                "the nightly job finds exactly the words and stores left wrong",
                bool(batch.get("ran"))
                and batch["word_keys_differing"] == batch["word_keys_wrong_measured"]
                and batch["stores_differing"] == batch["stores_wrong_measured"],
            )
        )
    if eos:
        checks.append(Check("word_counts exact after every kill -9", r["exact_after_every_kill"]))
        checks.append(
            Check(
                "inventory exact after every kill -9",
                r.get("inventory_exact_after_every_kill") is True,
            )
        )
    return checks


def broker_loss(r: dict[str, Any]) -> list[Check]:
    return [
        Check("topics have replication factor 3", min(r["replication_factor"].values()) == 3),
        Check("no acknowledged event lost", r["acked_but_lost"] == 0),
        Check(
            "processing went on while the broker was down", r["words_counted_while_broker_down"] > 0
        ),
        Check("workers not restarted", r["workers_same_process"]),
        Check("no agent crashed", r["agent_crashes"] == 0),
        Check("no word under-counted", r["drift"]["words_under"] == 0),
        Check("tables equal the ground truth", r["drift"]["exact"]),
    ]


def broker_outage(r: dict[str, Any]) -> list[Check]:
    return [
        Check("workers not restarted", r["workers_same_process"]),
        Check("no agent crashed", r["agent_crashes"] == 0),
        Check("/health answered 200 throughout", r["health_200"] == r["health_samples"]),
        Check(
            "/ready answered 503 with a reason while the broker was down",
            r["ready_503"] == r["ready_samples"] and bool(r["ready_reasons"]),
        ),
        Check(
            "ready again after the broker came back",
            all(s is not None for s in r["ready_again_after_s"]),
        ),
        Check("no acknowledged event lost", r["acked_but_lost"] == 0),
        Check("tables caught up with the ground truth", r["drift"]["exact"]),
    ]


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
        Check("every hostile request refused", not r["refusal_failures"]),
        Check("no connection to a host a request named", r["trap_connections"] == 0),
        Check("workers alive, no agent crashed", r["workers_alive"] and r["agent_crashes"] == 0),
    ]


def lost_disk(r: dict[str, Any]) -> list[Check]:
    return [
        Check("tables equal before and after, at the first ready", r["equal_at_ready"]),
        Check("every changelog record restored", r["records_restored"] == r["changelog_records"]),
        Check("no agent crashed", r["agent_crashes"] == 0),
    ]
