"""Settings for every test process.

Every JVM the tests start (Kafka nodes and their tools, Spark's driver, master, workers
and executors) compiles with the client compiler only. A test's JVM lives for seconds or
minutes, where C2's compiling costs more CPU than its faster code saves: a test broker
starts with about half the CPU. ``make bench`` and ``make chaos`` start theirs with the
JVM's defaults, as a deployment would.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

#: The tutorial's pipeline module lives outside the project's packages, as a user's
#: would (docs/tutorial/): tests import it from there.
TUTORIAL = Path(__file__).resolve().parents[1] / "docs" / "tutorial"
sys.path.insert(0, str(TUTORIAL))

#: Read by every ``java`` launcher of JDK 9 and later (each prints a note that it did).
os.environ.setdefault("JDK_JAVA_OPTIONS", "-XX:TieredStopAtLevel=1")

#: The slowest modules, about slowest first, by their time in ``make test``'s parallel part
#: (``--durations=0`` sums per module). ``make test`` hands whole modules to its processes
#: in this order as they free up (``--no-loadscope-reorder``; pytest-xdist would otherwise
#: order them by their number of tests, and a slow module with few tests started last runs
#: on alone at the end).
SLOWEST_FIRST = (
    "tests/integration/test_streaming.py",
    "tests/integration/test_settling.py",
    "tests/batch/test_cluster.py",
    "tests/integration/test_chaos_inputs.py",
    "tests/batch/test_recompute_live.py",
    "tests/batch/test_recompute_declared.py",
    "tests/integration/test_tutorial.py",
    "tests/integration/test_produce_unavailable.py",
    "tests/integration/test_consistency.py",
    "tests/integration/test_queries.py",
    "tests/integration/test_foundation.py",
    "tests/integration/test_added_pipeline.py",
    "tests/integration/test_console.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The slowest modules first, the rest in their usual order (a stable sort)."""
    rank = {path: n for n, path in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))
