"""Transient states of the Kafka client: INFO while young, one WARNING once they last
(core/logs.py)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from core.logs import GROUP_COORDINATOR, TransientStates, install_transient_states

COORDINATOR_FAILED = "Group Coordinator Request failed: %s"


class GroupCoordinatorNotAvailableError(Exception):
    """Named as aiokafka's error is: the filter tells errors by their class name."""


class GroupAuthorizationFailedError(Exception):
    pass


def record(msg: str, *args: object, at: float, level: int = logging.ERROR) -> logging.LogRecord:
    made = logging.LogRecord(GROUP_COORDINATOR, level, __file__, 1, msg, args, None)
    made.created = at
    return made


def levels(states: TransientStates, records: list[logging.LogRecord]) -> list[str]:
    for each in records:
        assert states.filter(each)
    return [each.levelname for each in records]


def not_available(at: float) -> logging.LogRecord:
    return record(COORDINATOR_FAILED, GroupCoordinatorNotAvailableError("[Error 15]"), at=at)


def test_a_coordinator_not_available_yet_is_info_then_one_warning_once_it_lasts() -> None:
    states = TransientStates(grace_s=10.0)
    found = [not_available(at=100.0 + 0.5 * n) for n in range(30)]
    assert levels(states, found) == ["INFO"] * 20 + ["WARNING"] + ["INFO"] * 9
    warning = found[20].getMessage()
    assert warning.startswith("still waiting for the group coordinator after 10 s")
    assert "GroupCoordinatorNotAvailableError" not in warning  # str(error) only
    assert "[Error 15]" in warning


def test_a_quiet_spell_ends_the_state_and_the_next_one_starts_young() -> None:
    states = TransientStates(grace_s=10.0)
    first = [not_available(at=100.0 + n) for n in range(12)]
    again = [not_available(at=130.0 + n) for n in range(3)]
    assert levels(states, first + again).count("WARNING") == 1
    assert [r.levelname for r in again] == ["INFO"] * 3


def test_a_rebalance_and_a_coordinator_are_timed_apart() -> None:
    states = TransientStates(grace_s=5.0)
    rebalancing = "Heartbeat failed for group %s because it is rebalancing"
    found = [
        record(rebalancing, "streamstate", at=100.0 + n, level=logging.WARNING) for n in range(7)
    ]
    found += [not_available(at=107.0)]
    assert levels(states, found) == ["INFO"] * 5 + ["WARNING", "INFO", "INFO"]
    assert "the group's rebalance to end" in found[5].getMessage()


def test_other_errors_of_the_same_logger_keep_their_level() -> None:
    states = TransientStates(grace_s=10.0)
    denied = record(COORDINATOR_FAILED, GroupAuthorizationFailedError("streamstate"), at=100.0)
    fatal = record("Attempt to join group failed due to fatal error: %s", "x", at=100.0)
    other = record(COORDINATOR_FAILED, GroupCoordinatorNotAvailableError("x"), at=100.0)
    other.name = "aiokafka.conn"
    assert levels(states, [denied, fatal, other]) == ["ERROR", "ERROR", "ERROR"]


class KafkaConnectionError(Exception):
    pass


def test_a_request_cut_by_a_lost_connection_is_transient_other_send_errors_are_not() -> None:
    states = TransientStates(grace_s=10.0)
    sending = "Error sending %s to node %s [%s] -- marking coordinator dead"
    cut = record(sending, "OffsetFetchRequest", 1, KafkaConnectionError("closed"), at=100.0)
    denied = record(sending, "OffsetFetchRequest", 1, GroupAuthorizationFailedError(), at=100.0)
    assert levels(states, [cut, denied]) == ["INFO", "ERROR"]


@pytest.fixture
def coordinator_logger() -> Iterator[logging.Logger]:
    logger = logging.getLogger(GROUP_COORDINATOR)
    filters, level = list(logger.filters), logger.level
    yield logger
    logger.filters[:] = filters
    logger.setLevel(level)


def test_installed_on_the_clients_logger_a_handler_sees_info(
    coordinator_logger: logging.Logger, caplog: pytest.LogCaptureFixture
) -> None:
    install_transient_states(grace_s=30.0)
    with caplog.at_level(logging.INFO, logger=GROUP_COORDINATOR):
        coordinator_logger.error(COORDINATOR_FAILED, GroupCoordinatorNotAvailableError("x"))
        coordinator_logger.error("Heartbeat failed: %r", ValueError("unexpected"))
    assert [(r.levelname, r.getMessage()[:26]) for r in caplog.records] == [
        ("INFO", "Group Coordinator Request "),
        ("ERROR", "Heartbeat failed: ValueErr"),
    ]


class NodeNotReadyError(Exception):
    pass


class TopicAuthorizationFailedError(Exception):
    pass


def outage_record(n: int, at: float) -> logging.LogRecord:
    """One of the messages a worker's clients log many times a second without a broker."""
    kind = n % 3
    if kind == 0:
        made = record(
            "Unable connect to node with id %s: %s", 1, ConnectionRefusedError(111), at=at
        )
        made.name = "aiokafka"
    elif kind == 1:
        made = record("Unable to update metadata from %s", [1], at=at)
        made.name = "aiokafka"
    else:
        made = record("Failed fetch messages from %s: %s", 1, NodeNotReadyError("node 1"), at=at)
        made.name = "aiokafka.consumer.fetcher"
    return made


def test_a_broker_out_of_reach_is_thinned_to_one_line_per_message_every_few_seconds() -> None:
    states = TransientStates(grace_s=20.0)
    # 45 s of outage, 300 records a second over three messages.
    found = [outage_record(n, at=100.0 + n / 300) for n in range(45 * 300)]
    logged = [each for each in found if states.filter(each)]
    assert 27 <= len(logged) <= 30  # each message once every 5 s: 9 or 10 times each
    assert [each.levelname for each in logged].count("WARNING") == 1
    assert {each.levelname for each in logged} == {"INFO", "WARNING"}
    [warning] = [each for each in logged if each.levelname == "WARNING"]
    assert warning.getMessage().startswith("still waiting for a broker to answer after 20 s")
    later = [each.getMessage() for each in logged if each.created > 106.0]
    assert all(" more like it in 5 s)" in text for text in later if "still" not in text), later


def test_other_client_errors_of_an_outage_logger_are_neither_hushed_nor_thinned() -> None:
    states = TransientStates(grace_s=20.0)
    denied = []
    for n in range(20):
        made = record(
            "Failed fetch messages from %s: %s",
            1,
            TopicAuthorizationFailedError("text-lines"),
            at=100.0 + n / 10,
        )
        made.name = "aiokafka.consumer.fetcher"
        denied.append(made)
    assert levels(states, denied) == ["ERROR"] * 20
