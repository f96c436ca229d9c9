"""Discard local table state that an unclean stop may have left dirty, under exactly_once.

faust writes table updates to RocksDB as it processes, before the transaction that
carries their changelog records and source offsets commits. After a kill -9 the local
databases can hold updates of transactions the broker then aborted, and the restart
would reprocess those events on top of them (counts go up twice). Like Kafka Streams
without a checkpoint file, a worker that did not stop cleanly under exactly_once
deletes its local table state and restores it from the changelogs, which hold committed
records only.

A clean stop is no exception under exactly_once either: faust keeps no usable changelog
offset there (it files the offsets under the changelog's partitions and looks them up
under the source's), so recovery reads every changelog from the start anyway, and an
old offset left in a local database has made the restart fail (faust's
``ConsistencyError``: a local offset above a changelog's last stable offset, while a
transaction the stop left open was still being aborted). Local table state is therefore
always rebuilt from the changelogs under exactly_once, at no extra reading.

The marker file is written after a clean stop and removed at start; it names how the
last run ended in the log.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

logger = logging.getLogger(__name__)

MARKER = "streamstate.clean-shutdown"


def discard_if_unclean(datadir: Path, tabledir: Path, exactly_once: bool) -> bool:
    """At start, under exactly_once: drop local table state (left by an unclean stop, or
    by a clean one); True if it was dropped."""
    marker = datadir / MARKER
    clean = marker.exists()
    marker.unlink(missing_ok=True)
    if not exactly_once or not tabledir.exists() or not any(tabledir.iterdir()):
        return False
    if clean:
        logger.info(
            "exactly_once: local table state in %s is rebuilt from the changelog topics",
            tabledir,
        )
    else:
        logger.warning(
            "the last run did not stop cleanly under exactly_once: discarding local table "
            "state in %s; it is restored from the changelog topics",
            tabledir,
        )
    shutil.rmtree(tabledir)
    return True


def mark_clean(datadir: Path) -> None:
    """After a clean stop: the local state matches what the broker committed."""
    datadir.mkdir(parents=True, exist_ok=True)
    (datadir / MARKER).write_text("stopped cleanly\n")
