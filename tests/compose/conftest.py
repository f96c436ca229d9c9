"""The compose cluster's figures, printed at the end of the run.

The tests of this folder start docker-compose.yml on a container engine; `make
compose-test` (ops/docker/cluster.sh test) builds the images and points them at it.
"""

from __future__ import annotations

import pytest

#: Figures the tests measured, printed in the terminal summary (name -> text).
FIGURES: dict[str, str] = {}


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if FIGURES:
        terminalreporter.section("compose cluster figures")
        for name, text in FIGURES.items():
            terminalreporter.write_line(f"{name}: {text}")
