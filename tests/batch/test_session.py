"""The job's Spark session, as ``jobs.session.build_session`` configures it."""

from __future__ import annotations

from typing import Any

import pytest

from jobs.session import (
    ARROW_MAX_BYTES_KEY,
    ARROW_MAX_RECORDS,
    ARROW_MAX_RECORDS_KEY,
    NO_ARROW_BYTE_LIMIT,
)

pytestmark = [pytest.mark.batch]


def test_arrow_batches_to_the_python_workers_have_no_byte_limit(spark: Any) -> None:
    """Spark measures a batch after every row while a byte limit is set; at Int.MaxValue
    it does not, and the job's record limit alone bounds a batch."""
    assert spark.conf.get(ARROW_MAX_BYTES_KEY) == str(NO_ARROW_BYTE_LIMIT)
    # Set by the job, not Spark's default of the same value: the session's SparkConf
    # holds only what was set.
    assert spark.sparkContext.getConf().get(ARROW_MAX_RECORDS_KEY) == str(ARROW_MAX_RECORDS)
    assert int(spark.conf.get(ARROW_MAX_RECORDS_KEY)) == ARROW_MAX_RECORDS == 10_000
