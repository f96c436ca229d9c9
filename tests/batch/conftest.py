"""One local Spark session per test module (2 cores, few shuffle partitions)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from jobs.session import build_session


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    session = build_session("local[2]", shuffle_partitions=4)
    try:
        yield session
    finally:
        session.stop()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # pyspark 4.2 warns about pandas 3 whenever a pandas UDF is built or run.
    ignore = pytest.mark.filterwarnings(
        "ignore:PySpark does not yet fully support pandas:FutureWarning"
    )
    for item in items:
        if "tests/batch/" in str(item.path).replace("\\", "/"):
            item.add_marker(ignore)
