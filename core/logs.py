"""Transient states the Kafka client logs as errors, told apart from lasting ones.

aiokafka logs some states a worker simply waits out at ERROR or WARNING: a group
coordinator that is not available yet (a fresh broker creates its offsets topic and loads
the group: tens of ``Group Coordinator Request failed: [Error 15]
GroupCoordinatorNotAvailableError`` before the first join), or a rebalance under way
(``Heartbeat failed ... because it is rebalancing``), or a request to the coordinator
cut by a lost connection. Operators alert on ERROR, so the
worker installs :class:`TransientStates` on the loggers that say these things: such a
record is logged at INFO while its state is young; once the state has lasted
``grace_s``, one record of it is logged at WARNING, naming what the worker waits for and
since when; the rest stay at INFO. A state ends when none of its records came for
``grace_s``; the next one begins a new episode.

A broker out of reach is such a state too, and a loud one: every client retries every
connection and fetch many times a second (about 300 ERROR lines a second in a
45-second outage of a two-worker group). Its records are also thinned: of each message,
one every :data:`REPEAT_S` at most, the next one saying how many like it were left out.

Only the records named here are touched, and only with the errors named here: any other
record of those loggers (an authorization failure, an unexpected error) keeps its level.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

#: The aiokafka errors of a coordinator that is not there yet or has moved.
COORDINATOR_ERRORS = frozenset(
    {
        "GroupCoordinatorNotAvailableError",
        "CoordinatorNotAvailableError",
        "NotCoordinatorForGroupError",
        "NotCoordinatorError",
        "GroupLoadInProgressError",
        "CoordinatorLoadInProgressError",
        "RequestTimedOutError",
        "NodeNotReadyError",
    }
)


#: A request's connection to the coordinator lost (it closed, or did not answer in time).
CONNECTION_ERRORS = frozenset({"KafkaConnectionError", "RequestTimedOutError"})


#: A request that found no broker to take it: none reachable, or none ready yet.
UNREACHABLE_ERRORS = frozenset(
    {"KafkaConnectionError", "NodeNotReadyError", "RequestTimedOutError"}
)

#: A thinned state logs one record of each of its messages this often at most (seconds).
REPEAT_S = 5.0


def _arg_is_a(index: int, names: frozenset[str]) -> Callable[[logging.LogRecord], bool]:
    def matches(record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        return len(args) > index and type(args[index]).__name__ in names

    return matches


def _first_arg_is_a(names: frozenset[str]) -> Callable[[logging.LogRecord], bool]:
    return _arg_is_a(0, names)


def _always(record: logging.LogRecord) -> bool:
    return True


@dataclass(frozen=True)
class Transient:
    """Records of ``logger`` whose message template is ``template`` (and that
    ``matches`` accepts) say that the worker waits for ``waiting_for``."""

    logger: str
    template: str
    waiting_for: str
    matches: Callable[[logging.LogRecord], bool] = _always
    #: log one record of this message every ``repeat_s`` at most (None: every one)
    repeat_s: float | None = None


GROUP_COORDINATOR = "aiokafka.consumer.group_coordinator"
CLIENT = "aiokafka"
FETCHER = "aiokafka.consumer.fetcher"
SENDER = "aiokafka.producer.sender"
COORDINATOR = "the group coordinator"
REBALANCE = "the group's rebalance to end"
BROKER = "a broker to answer"

#: The transient states of the worker's Kafka clients.
TRANSIENT_STATES = (
    Transient(
        GROUP_COORDINATOR,
        "Group Coordinator Request failed: %s",
        COORDINATOR,
        _first_arg_is_a(COORDINATOR_ERRORS),
    ),
    Transient(
        GROUP_COORDINATOR, "Marking the coordinator dead (node %s)for group %s.", COORDINATOR
    ),
    # A request cut by a lost connection: aiokafka finds the coordinator again (at a
    # worker's stop, its own client closing cuts a request the group's rebalance began).
    Transient(
        GROUP_COORDINATOR,
        "Error sending %s to node %s [%s] -- marking coordinator dead",
        COORDINATOR,
        _arg_is_a(2, CONNECTION_ERRORS | COORDINATOR_ERRORS),
    ),
    Transient(
        GROUP_COORDINATOR,
        "Heartbeat failed for group %s: coordinator (node %s) is either not started or not valid",
        COORDINATOR,
    ),
    Transient(
        GROUP_COORDINATOR,
        "Heartbeat send request failed: %s. Will retry.",
        COORDINATOR,
        _first_arg_is_a(COORDINATOR_ERRORS),
    ),
    Transient(
        GROUP_COORDINATOR, "Heartbeat failed for group %s because it is rebalancing", REBALANCE
    ),
    # A broker out of reach: the client's connections, metadata, fetches and sends.
    Transient(CLIENT, "Unable connect to node with id %s: %s", BROKER, repeat_s=REPEAT_S),
    Transient(CLIENT, "Unable to update metadata from %s", BROKER, repeat_s=REPEAT_S),
    Transient(
        CLIENT,
        "Unable to request metadata from node with id %s: %r",
        BROKER,
        _arg_is_a(1, UNREACHABLE_ERRORS),
        repeat_s=REPEAT_S,
    ),
    Transient(
        FETCHER,
        "Failed fetch messages from %s: %s",
        BROKER,
        _arg_is_a(1, UNREACHABLE_ERRORS),
        repeat_s=REPEAT_S,
    ),
    Transient(
        SENDER,
        "Got error produce response: %s",
        BROKER,
        _first_arg_is_a(UNREACHABLE_ERRORS),
        repeat_s=REPEAT_S,
    ),
)


@dataclass
class _Episode:
    began: float
    last: float
    warned: bool = False
    #: per message of a thinned state: when one was last logged, how many left out since
    logged: dict[str, tuple[float, int]] = field(default_factory=dict)


class TransientStates(logging.Filter):
    """Logs the records of transient states at INFO until their state has lasted
    ``grace_s``, then one of them at WARNING (see the module's docstring)."""

    def __init__(self, states: Iterable[Transient] = TRANSIENT_STATES, grace_s: float = 20.0):
        super().__init__()
        self.states = tuple(states)
        self.grace_s = grace_s
        self._episodes: dict[str, _Episode] = {}
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        state = self._state_of(record)
        if state is None:
            return True
        with self._lock:
            episode = self._episodes.get(state.waiting_for)
            if episode is None or record.created - episode.last > self.grace_s:
                episode = self._episodes[state.waiting_for] = _Episode(record.created, 0.0)
            episode.last = record.created
            lasted = record.created - episode.began
            if lasted < self.grace_s or episode.warned:
                _set_level(record, logging.INFO)
                return self._thinned(state, episode, record)
            episode.warned = True
            episode.logged[state.template] = (record.created, 0)
        message = record.getMessage()
        record.msg = (
            f"still waiting for {state.waiting_for} after {lasted:.0f} s "
            f"(latest: {message}); until it ends such messages stay at INFO"
        )
        record.args = ()
        _set_level(record, logging.WARNING)
        return True

    @staticmethod
    def _thinned(state: Transient, episode: _Episode, record: logging.LogRecord) -> bool:
        """Whether a record of a young (or already reported) state is logged: all of
        them, or for a thinned state one of each message every ``repeat_s``."""
        if state.repeat_s is None:
            return True
        last, left_out = episode.logged.get(state.template, (None, 0))
        if last is not None and record.created - last < state.repeat_s:
            episode.logged[state.template] = (last, left_out + 1)
            return False
        episode.logged[state.template] = (record.created, 0)
        if left_out and last is not None:
            since = record.created - last
            record.msg = f"{record.getMessage()} ({left_out} more like it in {since:.0f} s)"
            record.args = ()
        return True

    def _state_of(self, record: logging.LogRecord) -> Transient | None:
        if record.levelno < logging.WARNING:
            return None
        for state in self.states:
            if (
                state.logger == record.name
                and state.template == record.msg
                and state.matches(record)
            ):
                return state
        return None


def _set_level(record: logging.LogRecord, level: int) -> None:
    record.levelno = level
    record.levelname = logging.getLevelName(level)


def install_transient_states(grace_s: float) -> TransientStates:
    """Put one :class:`TransientStates` on every logger that logs such states."""
    found = TransientStates(grace_s=grace_s)
    for name in sorted({state.logger for state in found.states}):
        logging.getLogger(name).addFilter(found)
    return found
