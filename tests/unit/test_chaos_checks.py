"""The chaos checks fail when what they name goes wrong (no broker, no worker)."""

from __future__ import annotations

import os
import time
from typing import Any

import pytest

from chaos import checks
from chaos import probe as probe_module
from chaos import session as session_module
from chaos.__main__ import exit_status
from chaos.compare import TableDrift
from chaos.env import chaos_port, cpu_seconds, log_phases
from chaos.load import LoadFigures, LoadLevel
from chaos.loadgen import MAX_OWED_S
from chaos.loadgen import Figures as GeneratorFigures
from chaos.nightly import cross_check
from chaos.probe import Answer
from chaos.scenarios.api_fuzz import _judge
from chaos.session import Session, calibrated

LEVEL = {"lines_per_s": 1000.0, "events_per_s": 100.0, "source": "test"}


# -- the offered load ---------------------------------------------------------------


def test_a_stall_counts_as_wall_time_and_owes_at_most_one_second() -> None:
    figures = GeneratorFigures()
    for _ in range(200):
        assert figures.elapsed(0.05) == 0.05
    assert figures.elapsed(5.0) == MAX_OWED_S
    assert figures.running_s == pytest.approx(15.0)
    assert figures.stalls == [(pytest.approx(15.0), 5.0)]
    assert figures.skipped_s == pytest.approx(4.0)


def test_a_generator_that_stalled_fails_the_offered_check() -> None:
    start = LoadFigures()
    # 15 s asked of it; it acknowledged 11 s worth of records (it stalled 4 s)
    stalled = LoadFigures(
        acked={"text-lines": 11_000, "item-events": 1_100},
        running_s=15.0,
        stalls=[(15.0, 5.0)],
        skipped_s=4.0,
    )
    load = {"level": LEVEL, **stalled.since(start)}
    assert load["offered_lines_per_s"] == 733
    assert (load["stalls"], load["longest_stall_s"], load["stalled_s"]) == (1, 5.0, 4.0)
    assert not checks.offered(load)[0].ok
    steady = LoadFigures(acked={"text-lines": 15_000, "item-events": 1_500}, running_s=15.0)
    assert checks.offered({"level": LEVEL, **steady.since(start)})[0].ok


def test_what_was_offered_counts_from_an_earlier_report_on() -> None:
    earlier = LoadFigures(acked={"text-lines": 500}, running_s=5.0, stalls=[(2.0, 3.0)])
    later = LoadFigures(acked={"text-lines": 1500}, running_s=6.0, stalls=[(2.0, 3.0), (5.5, 1.5)])
    offered = later.since(earlier)
    assert (offered["offered_lines_per_s"], offered["stalls"]) == (1000, 1)
    assert offered["longest_stall_s"] == 1.5


def test_the_calibrated_level_is_the_share_of_what_the_group_processed() -> None:
    probe = LoadLevel(40_000.0, 13_000.0, "bench", share=0.5)
    found = calibrated(probe, {"text-lines": 100_000, "item-events": 30_000}, 5.0, 20.0, True)
    assert (found.lines_per_s, found.events_per_s) == (5_000.0, 1_500.0)
    assert (found.level.lines_per_s, found.level.events_per_s) == (2_500, 750)
    assert found.level.share is None
    assert found.as_dict()["sustained_lines_per_s"] == 5_000


# -- a broker node lost --------------------------------------------------------------


def broker_loss(**changes: Any) -> dict[str, Any]:
    exact = TableDrift(keys_expected=3, traced=1).as_dict()
    figures: dict[str, Any] = {
        "replication_factor": {"text-lines": 3},
        "offered_while_down": {"offered_lines_per_s": 1000, "offered_events_per_s": 100},
        "processed_while_down": {"text-lines": 18_000, "item-events": 1_800},
        "processed_lines_per_s_while_down": 900,
        "processed_events_per_s_while_down": 90,
        "workers_same_process": True,
        "agent_crashes": 0,
        "drain_after_pause_s": 3.0,
        "drift": {"exact": True, **{name: exact for name in checks.TABLES}},
        "acked_records": 10,
        "acked_but_lost": 0,
        "records_out_of_sequence": 0,
        "load": {"level": LEVEL, "offered_lines_per_s": 1000, "offered_events_per_s": 100},
    }
    figures.update(changes)
    return figures


def failed(found: list[checks.Check]) -> list[str]:
    return [c.what for c in found if not c.ok]


def test_a_node_lost_under_load_passes_when_both_went_on_at_their_rates() -> None:
    assert failed(checks.broker_loss(broker_loss())) == []


def test_processing_that_crawled_while_the_node_was_down_fails() -> None:
    crawled = broker_loss(processed_lines_per_s_while_down=30)
    assert failed(checks.broker_loss(crawled)) == [
        "processing went on while the node was down: at least 50% of the offered lines and "
        "item events per second"
    ]


def test_producing_that_crawled_while_the_node_was_down_fails() -> None:
    crawled = broker_loss(
        offered_while_down={"offered_lines_per_s": 200, "offered_events_per_s": 100},
        processed_lines_per_s_while_down=150,
    )
    assert failed(checks.broker_loss(crawled)) == [
        "producing (acks=all) went on while the node was down: at least 95% of the planned "
        "rates acknowledged"
    ]


# -- the API under fuzzing -----------------------------------------------------------


def test_a_dropped_connection_or_a_timeout_is_not_a_refusal() -> None:
    group = {"http://127.0.0.1:1"}
    for error in ("ConnectionResetError(104)", "TimeoutError('timed out')"):
        judged = _judge("oversize key", "/tables/x", None, None, error, group, None, 0)
        assert not judged["refused"]
        assert judged["why_not"][0].startswith("no answer")
    refused = _judge("oversize key", "/tables/x", None, 400, {"detail": "x"}, group, None, 0)
    assert refused["refused"]


def api(**changes: Any) -> dict[str, Any]:
    figures = {
        "cases": 1000,
        "server_errors": 0,
        "generation_error_count": 0,
        "refusal_checks": 40,
        "refusal_failures": [],
        "trap_connections": 0,
        "workers_alive": True,
        "agent_crashes": 0,
    }
    return {**figures, **changes}


def test_an_error_of_hypothesis_itself_fails_the_fuzzing() -> None:
    assert failed(checks.api_fuzz(api())) == []
    assert failed(checks.api_fuzz(api(generation_error_count=1))) == [
        "Hypothesis generated every operation's cases without an error of its own"
    ]
    assert failed(checks.api_fuzz(api(refusal_checks=0))) == [
        "every hostile request answered and refused"
    ]


# -- the failover --------------------------------------------------------------------


def test_the_failover_is_timed_to_the_end_of_the_first_pass_answered_by_actives(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = {"now": 100.0}
    monkeypatch.setattr(probe_module.time, "monotonic", lambda: clock["now"])

    def read(front: Any, table: str, key: str) -> Answer:
        clock["now"] += 0.5  # each read takes half a second
        active = clock["now"] > 102.0
        replica = "active" if active else "standby"
        return Answer(clock["now"], "w1", table, key, 200, replica, "http://w1")

    monkeypatch.setattr(probe_module, "read", read)
    keys = [("word_counts", f"k{n}") for n in range(4)]
    found = probe_module.failover(["w1"], keys, "http://w0", since=100.0)  # type: ignore[list-item]
    # pass 1 ends at 102.0 with standbys; pass 2 reads from 102.5 to 104.0, all active
    assert found["seconds_to_active"] == 4.0
    assert found["reads"] == 8


# -- the nightly cross-check ---------------------------------------------------------


def report_entry(keys: list[str | tuple[str, int]]) -> dict[str, Any]:
    """A table's entry as the nightly report writes it (a window's key with its window)."""
    return {
        "mismatched": len(keys),
        "missing_in_stream": 0,
        "missing_in_batch": 0,
        "examples": [
            {"key": k} if isinstance(k, str) else {"key": k[0], "window": {"start": k[1]}}
            for k in keys
        ],
    }


def test_the_nightly_job_must_name_the_keys_measured_wrong_not_as_many_others() -> None:
    measured = {
        "word_counts": TableDrift(keys_wrong=2, wrong_keys=frozenset({"cat", "dog"})),
        "inventory": TableDrift(),
        "sales_by_category": TableDrift(keys_wrong=1, wrong_keys=frozenset({("dairy", 3600)})),
    }
    same = {
        "word_counts": report_entry(["cat", "dog"]),
        "inventory": report_entry([]),
        "sales_by_category": report_entry([("dairy", 3600)]),
    }
    assert cross_check(same, measured)["same_keys"]
    other = {**same, "word_counts": report_entry(["cat", "eel"])}
    found = cross_check(other, measured)
    assert found["keys_differing"] == found["keys_wrong_measured"]  # as many keys
    assert not found["same_keys"]
    assert (found["only_in_the_report"]["word_counts"], found["only_measured"]["word_counts"]) == (
        ["eel"],
        ["dog"],
    )
    assert not checks._nightly({"ran": True, **found}).ok


def test_a_report_that_lists_fewer_keys_than_it_counts_cannot_be_checked() -> None:
    entry = {**report_entry(["cat"]), "mismatched": 2}
    measured = {name: TableDrift() for name in ("word_counts", "inventory", "sales_by_category")}
    reported = {name: report_entry([]) for name in measured} | {"word_counts": entry}
    found = cross_check(reported, measured)
    assert not found["every_key_listed"]
    assert not found["same_keys"]


# -- the run ---------------------------------------------------------------------------


def test_a_run_with_a_skipped_scenario_does_not_exit_zero() -> None:
    assert exit_status(["pass", "target missed"]) == 0
    assert exit_status(["pass", "skipped"]) == 2
    assert exit_status(["skipped", "fail"]) == 1


def test_chaos_ports_follow_the_test_port_unless_set() -> None:
    assert chaos_port("CHAOS_KAFKA_PORT", 29192, 3500, {}) == 29192
    test_port = {"STREAMSTATE_TEST_KAFKA_PORT": "61092"}
    assert chaos_port("CHAOS_KAFKA_PORT", 29192, 3500, test_port) == 64592
    explicit = {**test_port, "CHAOS_KAFKA_PORT": "62000"}
    assert chaos_port("CHAOS_KAFKA_PORT", 29192, 3500, explicit) == 62000


# -- a restart's phases ----------------------------------------------------------------


def test_a_restarts_phases_come_from_its_own_process_log_lines() -> None:
    def line(second: float, pid: int, message: str) -> str:
        whole, millis = int(second), round((second % 1) * 1000)
        return f"[2026-11-26 10:00:{whole:02d},{millis:03d}] [{pid}] [INFO] {message}"

    lines = [
        line(1.0, 7, "[^Worker]: Starting..."),  # the killed process: not this restart
        line(5.0, 9, "[^Worker]: Starting..."),
        line(5.5, 9, "Joined group 'streamstate' (generation 4) with member_id m"),
        line(5.6, 9, "Executing _on_partitions_assigned"),
        line(6.4, 9, "generation id 4 app consumers id 4"),
        line(7.0, 9, "[^---TrackedRecovery]: Recovery complete"),
        line(7.5, 9, "[^---TrackedRecovery]: Worker ready"),
    ]
    started = time.mktime(time.strptime("2026-11-26 10:00:03", "%Y-%m-%d %H:%M:%S"))
    phases = log_phases(lines, 9, started)
    assert phases == {
        "start_to_first_log_s": 2.0,
        "first_log_to_joined_s": 0.5,
        "joined_to_assigned_s": 0.1,
        "assigned_to_recovering_s": 0.8,
        "recovering_to_restored_s": 0.6,
        "restored_to_recovered_s": 0.5,
        "joined_to_recovered_s": 2.0,
        "joins_before_ready": 1,
    }
    assert log_phases(lines[:-1], 9, started) == {}  # not ready yet: no figures


def test_cpu_seconds_of_a_process_grow_with_its_work() -> None:
    before = cpu_seconds(os.getpid())
    assert before is not None
    deadline = time.process_time() + 0.3
    while time.process_time() < deadline:
        pass
    after = cpu_seconds(os.getpid())
    assert after is not None
    assert after >= before + 0.2
    assert cpu_seconds(None) is None


def test_the_calibration_times_the_group_from_the_generators_first_records(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = {"now": 100.0}
    monkeypatch.setattr(session_module.time, "monotonic", lambda: clock["now"])
    monkeypatch.setattr(session_module.time, "sleep", lambda s: clock.update(now=clock["now"] + s))

    class Load:
        def wait_offering(self) -> LoadFigures:
            clock["now"] += 3.0  # the generator process starts, then offers for 1 s
            return LoadFigures(running_s=1.0)

        def pause(self) -> LoadFigures:
            acked = {"text-lines": 50_000, "item-events": 10_000}
            return LoadFigures(acked=acked, running_s=clock["now"] - 102.0)

    class Monitor:
        def wait_caught_up(self, timeout: float, since: float) -> float:
            return since + 15.0

    session = Session.__new__(Session)
    session.level = LoadLevel(40_000.0, 13_000.0, "bench", share=0.5)
    session.monitor = Monitor()  # type: ignore[assignment]
    found = session.calibrate(Load())  # type: ignore[arg-type]
    # offered from 102 to 107 (5 s), caught up at 122: 20 s from the first record
    assert (found.offered_s, found.processed_s, found.caught_up) == (5.0, 20.0, True)
    assert (found.lines_per_s, found.events_per_s) == (2_500.0, 500.0)


def test_a_broker_outage_is_judged_on_what_was_offered_while_the_broker_was_up() -> None:
    """Nothing can be acknowledged while the only broker is down: over the whole wall
    time the offered rate falls short by construction; over the time it was up it must
    still reach the plan, and falls short when the generator did."""
    level = {"lines_per_s": 4000, "events_per_s": 400}
    start = LoadFigures()
    before = LoadFigures(acked={"text-lines": 40_000, "item-events": 4_000}, running_s=10.0)
    back = LoadFigures(acked={"text-lines": 40_000, "item-events": 4_000}, running_s=20.0)
    after = LoadFigures(acked={"text-lines": 80_000, "item-events": 8_000}, running_s=30.0)
    load = {"level": level, **after.since(start)}
    assert not checks.offered(load)[0].ok  # 2,667 lines/s over the wall time
    while_up = start.until(before) + back.until(after)
    assert checks.offered(load, while_up.since(LoadFigures()), "the time it was up")[0].ok
    short = LoadFigures(acked={"text-lines": 60_000, "item-events": 6_000}, running_s=30.0)
    short_while_up = start.until(before) + back.until(short)
    assert not checks.offered(load, short_while_up.since(LoadFigures()), "up")[0].ok
