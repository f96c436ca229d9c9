"""The processes a scenario runs: a local Kafka, workers, and helpers to observe them."""

from __future__ import annotations

import asyncio
import itertools
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient

from tests.support.kafka import ROOT, WORKER, LocalKafka, running
from tests.support.kafka_io import list_topics
from tests.support.workers import Worker, stop_workers
from tests.support.workers import cpu_seconds as process_cpu_seconds

#: Kafka client ports of the chaos suite, outside Linux's ephemeral range (32768-60999):
#: workers keep reconnecting to a stopped broker, and a reconnect to a port in that range
#: can connect to itself (TCP self-connect) and keep the broker from binding it again.
#: ``CHAOS_KAFKA_PORT`` / ``CHAOS_KAFKA3_PORT`` set them; else they follow
#: ``STREAMSTATE_TEST_KAFKA_PORT`` (above the blocks the test modules take from it), so
#: that one setting keeps a developer's brokers apart from everyone else's. Under
#: pytest-xdist each test process takes its own ten ports (a node takes two).
CHAOS_OFFSET = 3500
CHAOS3_OFFSET = 3600


def chaos_port(name: str, default: int, offset: int, env: Mapping[str, str] = os.environ) -> int:
    """The first client port of a chaos cluster: ``name`` from the environment, else
    ``STREAMSTATE_TEST_KAFKA_PORT`` + ``offset``, else ``default``."""
    if env.get(name):
        return int(env[name])
    if env.get("STREAMSTATE_TEST_KAFKA_PORT"):
        return int(env["STREAMSTATE_TEST_KAFKA_PORT"]) + offset
    return default


SINGLE_PORT = chaos_port("CHAOS_KAFKA_PORT", 29192, CHAOS_OFFSET) + 10 * WORKER
TRIPLE_PORT = chaos_port("CHAOS_KAFKA3_PORT", 29292, CHAOS3_OFFSET) + 10 * WORKER
#: Workers' data dirs and logs, per Kafka port so that two runs never share one.
WORK = ROOT / ".cache" / "chaos" / str(SINGLE_PORT)

#: Worker settings every scenario uses.
WORKER_ENV = {"TOPIC_PARTITIONS": "8"}


@contextmanager
def cluster(name: str, brokers: int = 1) -> Iterator[LocalKafka]:
    """A fresh local Kafka for one scenario, stopped afterwards."""
    port = TRIPLE_PORT if brokers > 1 else SINGLE_PORT
    directory = ROOT / ".cache" / "test-kafka" / f"chaos-{name}-{port}"
    kafka = LocalKafka(port=port, brokers=brokers, directory=directory)
    try:
        reset(kafka)
        yield kafka
    finally:
        kafka.kill()


def reset(kafka: LocalKafka) -> None:
    """Stop the cluster, delete its data and start it again: every topic is gone. A
    running cluster that holds no topic at all (not even the group offsets' topic) is
    fresh already, and is kept as it is."""
    if kafka.pids() and _topics(kafka.bootstrap) == []:
        return
    kafka.kill()
    shutil.rmtree(kafka.directory, ignore_errors=True)
    start(kafka)


def _topics(bootstrap: str) -> list[str] | None:
    """Every topic of the cluster, internal ones included; None when it does not answer."""
    try:
        return asyncio.run(asyncio.wait_for(list_topics(bootstrap, request_timeout_ms=5000), 10.0))
    except Exception:  # not answering: the caller starts it afresh
        return None


def start(kafka: LocalKafka, attempts: int = 4, timeout: float = 60.0) -> None:
    """Start the nodes of the cluster that are not running; retry when one fails.

    A port taken a moment ago (a client that kept reconnecting to the stopped broker, a
    socket in TIME_WAIT) keeps the broker from binding it: waiting for the ports to be
    free and retrying works.
    """
    env = {**kafka.env(), "KAFKA_START_TIMEOUT": str(int(timeout))}
    for attempt in range(1, attempts + 1):
        _wait_ports_free(kafka)
        done = subprocess.run([str(ROOT / "ops/kafka.sh"), "up"], env=env, check=False)
        if done.returncode == 0:
            return
        if attempt == attempts:
            raise RuntimeError(f"Kafka on {kafka.bootstrap} did not start in {attempts} tries")
        time.sleep(2)


def _wait_ports_free(kafka: LocalKafka, timeout: float = 60.0) -> None:
    """Wait until no socket holds a client or controller port of a node that is not
    running; fail if one stays taken (ops/kafka.sh would take a broker already listening
    there for the one it started, and the scenario would run against another cluster)."""
    ports = [
        kafka.port + 2 * (node - 1) + offset
        for node in range(1, kafka.brokers + 1)
        if not _node_running(kafka, node)
        for offset in (0, 1)
    ]
    deadline = time.monotonic() + timeout
    while True:
        busy = [p for p in ports if not _bindable(p)]
        if not busy:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"ports {busy} stay taken by another process for {timeout}s")
        time.sleep(1.0)


def _node_running(kafka: LocalKafka, node: int) -> bool:
    pidfile = kafka.directory / f"node-{node}" / "kafka.pid"
    try:
        return running(int(pidfile.read_text()))
    except (OSError, ValueError):
        return False


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def workdir(name: str) -> Path:
    path = WORK / name
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


@dataclass
class Group:
    """Workers of one scenario; every one is stopped (by pid) when the scenario ends."""

    kafka: LocalKafka
    directory: Path
    env: dict[str, str] = field(default_factory=dict)
    workers: list[Worker] = field(default_factory=list)

    def add(self, name: str) -> Worker:
        worker = Worker(
            self.kafka, self.directory / name, extra_env={**WORKER_ENV, **self.env}
        ).start()
        self.workers.append(worker)
        return worker

    def restart(self, worker: Worker) -> Worker:
        """Start a stopped or killed worker again on the same data dir and port."""
        worker.start()
        return worker

    def stop_all(self) -> None:
        stop_workers(self.workers)


@contextmanager
def group(kafka: LocalKafka, directory: Path, **env: str) -> Iterator[Group]:
    workers = Group(kafka, directory, dict(env))
    try:
        yield workers
    finally:
        workers.stop_all()


def wait_ready(worker: Worker, timeout: float) -> tuple[float | None, str | None]:
    """(when a starting worker first answered /ready 200, None), or (None, why not);
    /ready is asked every 0.1 s, so the moment is exact to that."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not worker.alive():
            return None, f"exited: {worker.log_tail(3)[-400:]}"
        try:
            status, _ = worker.get("/ready", timeout=1.0)
        except OSError:
            status = None
        if status == 200:
            return time.monotonic(), None
        time.sleep(0.1)
    reasons = [line for line in worker.log_text().splitlines() if "Crashed reason" in line]
    return None, (reasons[-1] if reasons else f"not ready in {timeout}s")[-400:]


def wait_for(check: Callable[[], Any], timeout: float, interval: float = 0.5) -> Any:
    """Poll ``check`` until it returns something truthy; None on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(interval)
    return None


_LOG_LINE = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\] \[(\d+)\] \[\w+\] (.*)")

#: The moments of a restart in a worker's log, in the order they come: the first line
#: (the interpreter and the imports are done), the group joined, the assignment taken
#: (faust then opens the partition databases), the recovery begun, the active partitions
#: restored, faust's recovery done (standbys started, streams sought).
MILESTONES = (
    ("first_line", ""),
    ("joined", "Joined group"),
    ("assigned", "Executing _on_partitions_assigned"),
    ("recovering", "app consumers id"),
    ("restored", "Recovery complete"),
    ("recovered", "Worker ready"),
)


def _stamp(text: str) -> float:
    at = time.mktime(time.strptime(text[:19], "%Y-%m-%d %H:%M:%S"))
    return at + int(text[20:]) / 1000


def log_phases(lines: Iterable[str], pid: int, started_wall: float) -> dict[str, Any]:
    """Where a restart's time went, from the log lines of its process ``pid``: seconds
    from the start to the first line and between each two milestones (MILESTONES) up to
    faust's "Worker ready", and how many times it joined meanwhile; {} when the log
    lacks one."""
    stamps: dict[str, float] = {}
    joins = 0
    for line in lines:
        found = _LOG_LINE.match(line)
        if found is None or int(found.group(2)) != pid:
            continue
        message = found.group(3)
        joins += message.startswith("Joined group")
        for name, marker in MILESTONES:
            if name not in stamps and marker in message:
                stamps[name] = _stamp(found.group(1))
                break
        if "recovered" in stamps:
            break
    if set(stamps) != {name for name, _ in MILESTONES}:
        return {}
    names = [name for name, _ in MILESTONES]
    phases = {"start_to_first_log_s": round(stamps["first_line"] - started_wall, 2)}
    for before, after in itertools.pairwise(names):
        label = "first_log" if before == "first_line" else before
        phases[f"{label}_to_{after}_s"] = round(stamps[after] - stamps[before], 2)
    phases["joined_to_recovered_s"] = round(stamps["recovered"] - stamps["joined"], 2)
    phases["joins_before_ready"] = joins
    return phases


def restart_phases(worker: Worker, started_wall: float) -> dict[str, Any]:
    """:func:`log_phases` of the worker's current process."""
    process = worker.process
    if process is None:
        return {}
    return log_phases(worker.log_text().splitlines(), process.pid, started_wall)


def cpu_seconds(pid: int | None) -> float | None:
    """:func:`tests.support.workers.cpu_seconds`, to the hundredth of a second."""
    found = process_cpu_seconds(pid)
    return None if found is None else round(found, 2)


def evictions(peers: Iterable[Worker], url: str, since_wall: float) -> int:
    """How many times the peers removed the member ``url`` from the group since then."""
    count = 0
    for peer in peers:
        for line in peer.log_text().splitlines():
            found = _LOG_LINE.match(line)
            if (
                found is not None
                and f"member {url} refused" in found.group(3)
                and _stamp(found.group(1)) >= since_wall
            ):
                count += 1
    return count


def pid(worker: Worker) -> int | None:
    return worker.process.pid if worker.process is not None else None


def crashes(worker: Worker) -> int:
    """Agent crashes and restarts the worker logged (faust restarts a crashed agent)."""
    text = worker.log_text()
    return text.count("Crashed reason") + text.count("Restarting dead")


def kill_broker(kafka: LocalKafka, node: int) -> int:
    """kill -9 one broker node (1-based) by the pid its pid file holds."""
    pidfile = kafka.directory / f"node-{node}" / "kafka.pid"
    broker = int(pidfile.read_text())
    os.kill(broker, signal.SIGKILL)
    for _ in range(100):
        if not running(broker):
            break
        time.sleep(0.1)
    return broker


def scan(worker: Worker, table: str, timeout: float = 15.0) -> dict[str, Any]:
    """Every key of a table through one worker's API (all pages)."""
    items: dict[str, Any] = {}
    cursor: str | None = None
    while True:
        query = {"limit": "1000", **({"cursor": cursor} if cursor else {})}
        status, body = worker.get(
            f"/tables/{table}/keys?{urllib.parse.urlencode(query)}", timeout=timeout
        )
        if status != 200:
            raise RuntimeError(f"scan of {table} answered {status}: {body}")
        for item in body["items"]:
            items[item["key"]] = item["value"]
        missing = body["partitions"].get("missing") or []
        if missing:
            raise RuntimeError(f"scan of {table}: partitions {missing} missing")
        cursor = body.get("next_cursor")
        if not cursor:
            return items


def metric(worker: Worker, name: str, **labels: str) -> float:
    """The sum of one Prometheus metric's samples that carry ``labels``."""
    status, text = worker.get("/metrics")
    if status != 200 or not isinstance(text, str):
        raise RuntimeError(f"/metrics answered {status}")
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name) or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        metric_name, _, label_text = head.partition("{")
        if metric_name != name:
            continue
        if all(f'{k}="{v}"' in label_text for k, v in labels.items()):
            total += float(value)
    return total


class Trap:
    """A TCP listener that counts connections: a host no request may make a worker call."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = int(self.sock.getsockname()[1])
        self.hits = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.hits += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.sock.close()


def replication(bootstrap: str, topics: list[str]) -> dict[str, int]:
    """The smallest replica count over each topic's partitions."""

    async def describe() -> dict[str, int]:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            found = await admin.describe_topics(topics)
        finally:
            await admin.close()
        return {
            t["topic"]: min((len(p["replicas"]) for p in t["partitions"]), default=0) for t in found
        }

    return asyncio.run(describe())
