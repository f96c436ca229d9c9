"""Key reads while workers die: does every read answer, and who answers it.

A :class:`ReadProbe` reads a fixed set of keys (some in every partition of each table)
through the live workers, one after another, for as long as it runs, and keeps every
answer. :func:`failover` reads them in passes after a worker is gone for good, until a
whole pass is answered by active copies on the survivors.
"""

from __future__ import annotations

import threading
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any

from chaos.compare import Tables
from chaos.workload import partition_of
from tests.support.workers import Worker


@dataclass(frozen=True)
class Answer:
    at: float
    front: str
    table: str
    key: str
    status: int | None
    replica: str | None
    served_by: str | None
    detail: str | None = None
    #: how long the read took
    seconds: float | None = None

    def describe(self) -> str:
        return f"{self.table}/{self.key} via {self.front}: {self.status} {self.detail or ''}"


def sample_keys(tables: dict[str, list[str]], per_partition: int = 1) -> list[tuple[str, str]]:
    """Up to ``per_partition`` keys of each partition of each table."""
    chosen: list[tuple[str, str]] = []
    for table, keys in tables.items():
        taken: dict[int, int] = {}
        for key in sorted(keys):
            partition = partition_of(key.encode())
            if taken.get(partition, 0) < per_partition:
                taken[partition] = taken.get(partition, 0) + 1
                chosen.append((table, key))
    return chosen


def keys_to_read(tables: Tables, timeout: float = 120.0) -> list[tuple[str, str]]:
    """Two keys of each partition of word_counts and inventory, read from their
    changelogs through ``tables`` once they have some:
    on a busy machine the group may take a while to write its first ones."""
    deadline = time.monotonic() + timeout
    while True:
        tables.refresh()
        names = ("word_counts", "inventory")
        sampled = sample_keys(
            {name: [k.decode() for k in tables.state(name)] for name in names}, per_partition=2
        )
        if sampled:
            return sampled
        if time.monotonic() > deadline:
            raise RuntimeError(f"no key in word_counts or inventory after {timeout:g} s")
        time.sleep(1.0)


def read(front: Worker, table: str, key: str, timeout: float = 5.0) -> Answer:
    """One key read through ``front``; status None when it did not answer."""
    path = f"/tables/{table}/keys/{urllib.parse.quote(key, safe='')}"
    started = time.monotonic()
    try:
        status, body = front.get(path, timeout=timeout)
    except OSError as error:
        status, body = None, repr(error)
    fields = body if isinstance(body, dict) else {}
    detail = None if status == 200 else str(fields.get("detail") or body)[:200]
    return Answer(
        time.monotonic(),
        front.url,
        table,
        key,
        status,
        fields.get("replica"),
        str(fields.get("served_by") or "").rstrip("/") or None,
        detail,
        time.monotonic() - started,
    )


class ReadProbe:
    """Reads ``keys`` round-robin through the workers in :attr:`fronts`, in a thread."""

    def __init__(self, keys: list[tuple[str, str]], fronts: list[Worker], pace_s: float = 0.05):
        self.keys = keys
        self.fronts = list(fronts)
        self.pace_s = pace_s
        self.answers: list[Answer] = []
        #: the worker a read is in flight through, if any
        self.reading: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="read-probe", daemon=True)

    def start(self) -> ReadProbe:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(15)

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            fronts = self.fronts
            if fronts:
                table, key = self.keys[n % len(self.keys)]
                front = fronts[n % len(fronts)]
                self.reading = front.url
                self.answers.append(read(front, table, key))
                self.reading = None
                n += 1
            time.sleep(self.pace_s)

    def avoid(self, worker: Worker, timeout: float = 10.0) -> None:
        """Read only through the other workers from now on, once the read in flight
        through ``worker`` (if any) has ended: a worker about to be killed."""
        self.fronts = [w for w in self.fronts if w is not worker]
        deadline = time.monotonic() + timeout
        while self.reading == worker.url and time.monotonic() < deadline:
            time.sleep(0.01)

    def failed(self, start: float, end: float) -> list[Answer]:
        return [a for a in self.answers if start <= a.at <= end and a.status != 200]

    def count(self, start: float, end: float) -> int:
        return sum(1 for a in self.answers if start <= a.at <= end)


def failover(
    fronts: list[Worker],
    keys: list[tuple[str, str]],
    gone: str,
    since: float,
    timeout: float = 60.0,
) -> dict[str, Any]:
    """Read ``keys`` in passes through ``fronts`` until one whole pass is answered by
    active copies on workers other than ``gone``; seconds from ``since`` (the kill) to
    the end of that pass: only then is every key known to have been answered so (a pass
    takes a while, and its first keys may have been active elsewhere long before its
    last ones)."""
    answers: list[Answer] = []
    done_at = None
    n = 0
    while time.monotonic() - since < timeout:
        passed = [read(fronts[(n + i) % len(fronts)], t, k) for i, (t, k) in enumerate(keys)]
        n += 1
        answers += passed
        if all(a.status == 200 and a.replica == "active" and a.served_by != gone for a in passed):
            done_at = max((a.at for a in passed), default=time.monotonic())
            break
    failed = [a for a in answers if a.status != 200]
    return {
        "seconds_to_active": None if done_at is None else round(done_at - since, 2),
        "reads": len(answers),
        "failed_reads": len(failed),
        "failed_examples": [a.describe() for a in failed[:3]],
        "standby_answers": sum(1 for a in answers if a.replica == "standby"),
    }
