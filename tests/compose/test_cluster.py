"""The compose cluster, started and used as a user would: through its published ports.

`make compose-test` runs this module (ops/docker/cluster.sh test): the images are built,
the engine's compose CLI is in STREAMSTATE_COMPOSE, and these tests start docker-compose.yml
(Kafka, three workers, the nightly scheduler, the demo generator), check it, and take it
down. The tests run in file order on one cluster: each builds on what the previous did.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.compose.conftest import FIGURES

pytestmark = pytest.mark.compose

ROOT = Path(__file__).resolve().parents[2]
WORKERS = ("worker-1", "worker-2", "worker-3")
#: How long `up` may take until every worker answers /ready with 200.
READY_TIMEOUT_S = float(os.environ.get("COMPOSE_READY_TIMEOUT", "600"))
VICTIM = "worker-2"


def host_port(worker: str) -> int:
    number = worker.rsplit("-", 1)[1]
    return int(os.environ.get(f"WORKER_{number}_PORT", str(6065 + int(number))))


def url(worker: str, path: str) -> str:
    return f"http://127.0.0.1:{host_port(worker)}{path}"


@dataclass
class Answer:
    status: int
    body: dict[str, Any]
    headers: dict[str, str]


def http(method: str, address: str, body: object = None, timeout: float = 35.0) -> Answer:
    """One HTTP exchange; a refused or reset connection is status 0."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(address, data=data, method=method)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            raw, status, fields = response.read(), response.status, response.headers
    except urllib.error.HTTPError as error:
        raw, status, fields = error.read(), error.code, error.headers
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return Answer(0, {}, {})
    # Header names are case-insensitive (uvicorn sends them in lower case): keyed in lower case.
    headers = {name.lower(): value for name, value in fields.items()}
    try:
        parsed = json.loads(raw) if raw else {}
    except ValueError:
        parsed = {"text": raw.decode(errors="replace")}
    return Answer(status, parsed if isinstance(parsed, dict) else {"value": parsed}, headers)


def wait_ready(worker: str, deadline: float) -> float:
    """Seconds until the worker's /ready answers 200; fails at the deadline."""
    started = time.monotonic()
    last = Answer(0, {}, {})
    while time.monotonic() < deadline:
        last = http("GET", url(worker, "/ready"), timeout=5)
        if last.status == 200:
            return time.monotonic() - started
        time.sleep(0.5)
    pytest.fail(f"{worker} not ready on port {host_port(worker)}: {last.status} {last.body}")


# --- the engine ---------------------------------------------------------------------------


@dataclass
class Cluster:
    """docker-compose.yml under the engine's compose CLI, as `make compose-test` set it up."""

    compose: list[str]
    engine: str
    project: str
    up_seconds: float = 0.0
    words: dict[str, int] = field(default_factory=dict)
    down: bool = False

    def run(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        command = [*self.compose, "--project-directory", str(ROOT), "-f"]
        command += [str(ROOT / "docker-compose.yml"), *args]
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout)

    def check(self, *args: str, timeout: float = 600) -> str:
        done = self.run(*args, timeout=timeout)
        assert done.returncode == 0, f"compose {' '.join(args)}: {done.stdout}{done.stderr}"
        return done.stdout

    def container_running(self, service: str) -> bool:
        ids = self.check("ps", "-q", service).split()
        assert len(ids) == 1, f"{service}: containers {ids}"
        state = subprocess.run(
            [self.engine, "inspect", "--format", "{{.State.Running}}", ids[0]],
            capture_output=True,
            text=True,
            check=True,
        )
        return state.stdout.strip() == "true"

    def leftovers(self) -> dict[str, list[str]]:
        """The project's containers, volumes and networks that the engine still has."""
        label = f"label=com.docker.compose.project={self.project}"
        found = {}
        for kind, args in (
            ("containers", ["ps", "-a", "--filter", label, "--format", "{{.Names}}"]),
            ("volumes", ["volume", "ls", "--filter", label, "--format", "{{.Name}}"]),
            ("networks", ["network", "ls", "--format", "{{.Name}}"]),
        ):
            done = subprocess.run([self.engine, *args], capture_output=True, text=True, check=True)
            names = done.stdout.split()
            if kind == "networks":
                names = [name for name in names if name.startswith(f"{self.project}_")]
            found[kind] = names
        return found


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    if "STREAMSTATE_COMPOSE" not in os.environ:
        pytest.fail("run through `make compose-test`, which builds the images and sets the engine")
    made = Cluster(
        compose=shlex.split(os.environ["STREAMSTATE_COMPOSE"]),
        engine=os.environ.get("CONTAINER_ENGINE", "docker"),
        project=os.environ.get("COMPOSE_PROJECT_NAME", ROOT.name),
    )
    assert not any(made.leftovers().values()), f"a cluster is already there: {made.leftovers()}"
    for port in (*map(host_port, WORKERS), int(os.environ.get("KAFKA_HOST_PORT", "19092"))):
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                pytest.fail(
                    f"127.0.0.1:{port} is taken: make compose-test COMPOSE_KAFKA_PORT=... "
                    "COMPOSE_WORKER_PORT=... moves the cluster's ports"
                )
    started = time.monotonic()
    try:
        made.check("up", "-d", "--no-build")
        deadline = started + READY_TIMEOUT_S
        for worker in WORKERS:
            wait_ready(worker, deadline)
        made.up_seconds = time.monotonic() - started
        yield made
    finally:
        if not made.down:
            logs = made.run("logs", "--no-color", "--tail", "40", timeout=120)
            print(logs.stdout[-20000:])
            made.run("down", "-v", "--remove-orphans", timeout=300)


# --- the checks, in order -------------------------------------------------------------------


def test_every_worker_is_ready_through_its_published_port(cluster: Cluster) -> None:
    FIGURES["up to every worker ready"] = f"{cluster.up_seconds:.1f} s"
    hosts = set()
    for worker in WORKERS:
        assert http("GET", url(worker, "/ready")).status == 200
        hosts |= {host["url"] for host in http("GET", url(worker, "/metadata")).body["hosts"]}
    assert hosts == {f"http://{worker}:6066" for worker in WORKERS}


def test_a_line_produced_through_one_worker_is_read_with_its_token_through_the_others(
    cluster: Cluster,
) -> None:
    # Words of their own, several per partition, each counted a known number of times.
    words = [f"compose{uuid.uuid4().hex[:12]}" for _ in range(24)]
    lines = [" ".join(words), " ".join(words[:8])]
    produced = http(
        "POST",
        url("worker-1", "/topics/text-lines/records"),
        {"records": [{"key": None, "value": line} for line in lines]},
    )
    assert produced.status == 200, produced.body
    assert len(produced.body["offsets"]) == len(lines)
    token = produced.body["token"]
    cluster.words = {word: 2 if n < 8 else 1 for n, word in enumerate(words)}
    for worker in ("worker-2", "worker-3"):
        for word, count in cluster.words.items():
            query = urllib.parse.urlencode({"consistent_with": token, "timeout_ms": 30000})
            answer = http("GET", url(worker, f"/tables/word_counts/keys/{word}?{query}"))
            assert answer.status == 200, (worker, word, answer.body)
            assert answer.body["value"] == count, (worker, word, answer.body)
            assert answer.headers.get("x-served-by", "").startswith("http://worker-")


@pytest.mark.timeout(1800)
def test_the_nightly_job_finds_no_key_differing(cluster: Cluster) -> None:
    # The job compares the tables at an offset cut the workers have caught up with, which
    # it waits for (jobs/cut.py); the demo generator never pauses, so it is stopped first.
    cluster.check("stop", "generator")
    started = time.monotonic()
    once = ("python", "-m", "ops.nightly", "--once")
    run = cluster.run("exec", "-T", "nightly", *once, timeout=1500)
    FIGURES["nightly job, once"] = f"{time.monotonic() - started:.1f} s"
    output = run.stdout + run.stderr
    reports = [line.split("report: ", 1)[1] for line in output.splitlines() if "report: " in line]
    assert reports, output[-5000:]
    report = json.loads(cluster.check("exec", "-T", "nightly", "cat", reports[-1].strip()))
    differing = {
        name: {k: entry[k] for k in ("mismatched", "missing_in_stream", "missing_in_batch")}
        for name, entry in report["tables"].items()
    }
    assert report["cut_settled"], report["group_lag"]
    assert all(sum(counts.values()) == 0 for counts in differing.values()), differing
    assert run.returncode == 0, output[-5000:]
    # The job compared the words produced above, and the demo generator's data too.
    assert report["tables"]["word_counts"]["keys_compared"] >= len(cluster.words)
    assert report["tables"]["inventory"]["keys_compared"] > 0
    FIGURES["nightly keys compared"] = ", ".join(
        f"{name} {entry['keys_compared']}" for name, entry in sorted(report["tables"].items())
    )


def owned_by(cluster: Cluster, worker: str) -> dict[str, int]:
    owned = {}
    for word, count in cluster.words.items():
        meta = http("GET", url("worker-1", f"/metadata/tables/word_counts/keys/{word}"))
        assert meta.status == 200, meta.body
        if meta.body["active"] == f"http://{worker}:6066":
            owned[word] = count
    return owned


def read_until_answered(worker: str, word: str, deadline: float) -> Answer:
    """A key read, retried while the group hands the dead worker's partitions over."""
    answer = Answer(0, {}, {})
    while time.monotonic() < deadline:
        answer = http("GET", url(worker, f"/tables/word_counts/keys/{word}"), timeout=10)
        if answer.status == 200:
            return answer
        time.sleep(0.5)
    return answer


def test_a_killed_workers_keys_are_answered_by_the_others_and_it_comes_back(
    cluster: Cluster,
) -> None:
    owned = owned_by(cluster, VICTIM)
    assert owned, f"{VICTIM} owns none of {len(cluster.words)} words"
    cluster.check("kill", "-s", "SIGKILL", VICTIM)
    killed = time.monotonic()
    assert not cluster.container_running(VICTIM)
    replicas: dict[str, int] = {}
    for survivor in ("worker-1", "worker-3"):
        for word, count in owned.items():
            answer = read_until_answered(survivor, word, killed + 60)
            assert answer.status == 200, (survivor, word, answer.status, answer.body)
            assert answer.body["value"] == count, (survivor, word, answer.body)
            assert answer.body["served_by"] != f"http://{VICTIM}:6066"
            replicas[answer.body["replica"]] = replicas.get(answer.body["replica"], 0) + 1
    answered = time.monotonic() - killed
    assert not cluster.container_running(VICTIM), "the killed worker came back by itself"
    assert set(replicas) <= {"standby", "active"}, replicas
    FIGURES["killed worker's keys answered by the others"] = (
        f"{2 * len(owned)} reads in {answered:.1f} s, by replica: {replicas}"
    )

    cluster.check("start", VICTIM)
    back = wait_ready(VICTIM, time.monotonic() + 120)
    FIGURES["killed worker ready again after start"] = f"{back:.1f} s"
    for word, count in owned.items():
        answer = read_until_answered(VICTIM, word, time.monotonic() + 60)
        assert answer.status == 200, (word, answer.status, answer.body)
        assert answer.body["value"] == count, (word, answer.body)


def test_down_leaves_nothing_of_the_cluster(cluster: Cluster) -> None:
    cluster.down = True
    started = time.monotonic()
    cluster.check("down", "-v", "--remove-orphans", timeout=300)
    FIGURES["compose down"] = f"{time.monotonic() - started:.1f} s"
    assert cluster.leftovers() == {"containers": [], "volumes": [], "networks": []}
    for worker in WORKERS:
        assert http("GET", url(worker, "/health"), timeout=5).status == 0, worker
