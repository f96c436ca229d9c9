"""When a loaded scenario's comparison after a pause ends (chaos.session.Session.settle)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from chaos import session as session_module
from chaos.compare import Drift, TableDrift
from chaos.session import Session

EXACT = Drift({"word_counts": TableDrift()})
OVER_3 = Drift({"word_counts": TableDrift(over=3, keys_wrong=2, examples=("a: 5 for 4",))})
OVER_5 = Drift({"word_counts": TableDrift(over=5, keys_wrong=3, examples=("a: 6 for 4",))})


class Monitor:
    def wait_caught_up(self, timeout: float, since: float) -> float:
        return since + 1.0


class Reads(Session):
    """A session whose comparisons return ``drifts`` in turn (no cluster)."""

    def __init__(self, drifts: list[Drift]) -> None:
        self.found: Iterator[Drift] = iter(drifts)
        self.compared = 0
        self.monitor = Monitor()  # type: ignore[assignment]

    def refresh_truth(self) -> int:
        return 0

    def compare(self) -> Drift:
        self.compared += 1
        return next(self.found)


@pytest.fixture(autouse=True)
def no_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(session_module.time, "sleep", lambda _s: None)


def test_an_exact_comparison_ends_the_wait() -> None:
    reads = Reads([OVER_3, EXACT, OVER_3])
    assert reads.settle().drift == EXACT
    assert reads.compared == 2


def test_a_drift_that_stays_the_same_ends_the_wait_only_where_tables_may_drift() -> None:
    drifting = Reads([OVER_3, OVER_5, OVER_5, OVER_5, OVER_5])
    assert drifting.settle(drifts=True).drift == OVER_5
    assert drifting.compared == 3  # the second OVER_5 confirms the first
    exact_wanted = Reads([OVER_3, OVER_5, OVER_5, OVER_5, OVER_5])
    assert exact_wanted.settle().drift == OVER_5
    assert exact_wanted.compared == 5  # every attempt, in case a changelog is in flight


def test_a_drift_that_keeps_changing_takes_every_attempt() -> None:
    reads = Reads([OVER_3, OVER_5, OVER_3, OVER_5, OVER_3])
    assert reads.settle(drifts=True).drift == OVER_3
    assert reads.compared == 5
