"""Audit of the local copies: does each table partition a worker keeps on disk hold
exactly what its changelog says?

A worker's RocksDB partition (active or standby) records the last changelog offset it
applied. Replaying the changelog's committed records up to that offset must give the
partition's keys and values, no more and no less. A copy that skipped records (a fetch
dropped on the way to a standby, a restore that jumped ahead) shows here as keys that
are missing, extra or different, even when the tables served afterwards happen to be
right because the keys were written again.

Compaction removes a key's older records once a newer one exists, also past the copy's
offset, so a replay is exact only for a copy that is up to date: one whose offset is at
or past the partition's last record. Copies behind it are counted, not compared. A
changelog that also deletes by time (a windowed table's) must still hold what the copy
holds: the audit runs right after the scenario, well within the retention. The workers
must be stopped (each partition database is opened read-only).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rocksdict import AccessType, Options, Rdict

from tests.support.kafka_io import Record, read_topic

#: faust's key of the last applied changelog offset in each partition database.
OFFSET_KEY = b"__faust\x00offset__"
READ_ONLY = AccessType.read_only()
_PARTITION_DB = re.compile(r"^(?P<table>.+)-(?P<partition>\d+)\.db$")


@dataclass
class Copy:
    """One partition database of one worker."""

    worker: str
    table: str
    partition: int
    offset: int | None
    data: dict[bytes, bytes]


@dataclass
class Audit:
    """What the audit found over every copy it read."""

    compared: int = 0
    behind: int = 0
    #: "worker table[partition]: n missing, n extra, n different (at offset o)"
    differences: list[str] = field(default_factory=list)

    @property
    def exact(self) -> bool:
        return not self.differences

    def as_dict(self) -> dict[str, Any]:
        return {
            "copies_compared": self.compared,
            "copies_behind": self.behind,
            "differences": self.differences[:20],
            "exact": self.exact,
        }


def read_copies(workers: Iterable[tuple[str, Path]], tables: Iterable[str]) -> list[Copy]:
    """The partition databases of ``tables`` under each worker's data directory."""
    wanted = set(tables)
    copies = []
    for name, directory in workers:
        for path in sorted(directory.glob("**/*.db")):
            match = _PARTITION_DB.match(path.name)
            if match is None or match["table"] not in wanted:
                continue
            db = Rdict(str(path), options=Options(raw_mode=True), access_type=READ_ONLY)
            try:
                data = {k: v for k, v in db.items() if isinstance(k, bytes)}
            finally:
                db.close()
            raw = data.pop(OFFSET_KEY, None)
            offset = None if raw is None else int(raw)
            copies.append(Copy(name, match["table"], int(match["partition"]), offset, data))
    return copies


#: A changelog partition replayed: its last record's offset, and its latest value per key.
Replay = tuple[int, dict[bytes, bytes]]


def replay(records: Iterable[Record]) -> dict[int, Replay]:
    """Each partition of a changelog replayed in offset order (tombstones delete)."""
    found: dict[int, Replay] = {}
    for record in records:
        _, values = found.get(record.partition, (-1, {}))
        if record.key is not None:
            if record.value is None:
                values.pop(record.key, None)
            else:
                values[record.key] = record.value
        found[record.partition] = (record.offset, values)
    return found


def audit(bootstrap: str, copies: list[Copy], changelog_of: dict[str, str]) -> Audit:
    """Compare each up-to-date copy with its changelog replayed up to its offset."""
    found = Audit()
    logs: dict[str, dict[int, Replay]] = {}
    for copy in copies:
        topic = changelog_of[copy.table]
        if topic not in logs:
            logs[topic] = replay(read_topic(bootstrap, topic))
        last, expected = logs[topic].get(copy.partition, (-1, {}))
        if copy.offset is None or copy.offset < last:
            found.behind += 1
            continue
        found.compared += 1
        missing = expected.keys() - copy.data.keys()
        extra = copy.data.keys() - expected.keys()
        different = [k for k in expected.keys() & copy.data.keys() if expected[k] != copy.data[k]]
        if missing or extra or different:
            found.differences.append(
                f"{copy.worker} {copy.table}[{copy.partition}]: {len(missing)} missing, "
                f"{len(extra)} extra, {len(different)} different (at offset {copy.offset})"
            )
    return found
