"""A Spark standalone cluster on this machine, from the installed pyspark distribution:
one master and N one-core workers on 127.0.0.1, each a process of its own, stopped by
process id. The batch tests and the benchmark run the nightly job against it.

Each worker gets the environment a cluster node would have: no ``PYSPARK_PYTHON``, no
``VIRTUAL_ENV`` or ``PYTHONPATH``, a ``PATH`` without the driver's virtualenv (so its
``python3`` is the machine's, not the project's) and a work directory of its own, where
its executors unpack what the job ships and write their logs.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Variables a node of a real cluster would not have: they point at the driver's Python.
DRIVER_ONLY_ENV = ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "VIRTUAL_ENV", "PYTHONPATH")
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"


class ClusterError(RuntimeError):
    """The local standalone cluster did not come up."""


def spark_home() -> Path:
    """The installed pyspark package folder: a Spark distribution with ``bin/spark-class``."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def node_env(base: Mapping[str, str], driver_prefix: str = sys.prefix) -> dict[str, str]:
    """``base`` as a cluster node would have it: without the variables that name the
    driver's Python and without the driver's virtualenv on ``PATH``."""
    env = {k: v for k, v in base.items() if k not in DRIVER_ONLY_ENV}
    venv_bin = (Path(driver_prefix) / "bin").resolve()
    path = [p for p in env.get("PATH", "").split(os.pathsep) if p and Path(p).resolve() != venv_bin]
    env["PATH"] = os.pathsep.join(path)
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    env["SPARK_HOME"] = str(spark_home())
    return env


@dataclass
class Daemon:
    """One master or worker JVM."""

    name: str
    command: list[str]
    log: Path
    env: dict[str, str]
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            # A session of its own: its executors are stopped with it (see stop).
            self.process = subprocess.Popen(
                self.command,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def stop(self, grace_s: float = 15.0) -> None:
        """SIGTERM (a worker's shutdown hook stops its executors), then SIGKILL to the
        daemon's process group, which its executors belong to."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        with contextlib.suppress(ProcessLookupError, PermissionError):  # none of it is left
            os.killpg(self.process.pid, signal.SIGKILL)


@dataclass
class StandaloneCluster:
    """A master and ``workers`` one-core workers under ``root`` (logs and work dirs)."""

    root: Path
    workers: int = 2
    worker_memory: str = "2g"
    base_env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    port: int = field(default_factory=free_port)
    ui_port: int = field(default_factory=free_port)
    daemons: list[Daemon] = field(default_factory=list)

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    @property
    def pids(self) -> list[int]:
        return [d.pid for d in self.daemons if d.pid is not None]

    def _spark_class(self, *args: str) -> list[str]:
        return [str(spark_home() / "bin" / "spark-class"), *args]

    def start(self, timeout_s: float = 120.0) -> StandaloneCluster:
        env = node_env(self.base_env)
        master_command = self._spark_class(
            MASTER_CLASS, "--host", "127.0.0.1", "--port", str(self.port),
            "--webui-port", str(self.ui_port),
        )  # fmt: skip
        master = Daemon("master", master_command, self.root / "master.log", env)
        self.daemons.append(master)
        master.start()
        for n in range(1, self.workers + 1):
            work = self.root / f"worker-{n}"
            work.mkdir(parents=True, exist_ok=True)
            command = self._spark_class(
                WORKER_CLASS, self.master_url, "--host", "127.0.0.1",
                "--port", str(free_port()), "--webui-port", str(free_port()),
                "--cores", "1", "--memory", self.worker_memory, "--work-dir", str(work),
            )  # fmt: skip
            worker = Daemon(f"worker-{n}", command, self.root / f"worker-{n}.log", env)
            self.daemons.append(worker)
            worker.start()
        try:
            self.wait_alive(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def state(self) -> dict[str, Any]:
        """The master's JSON status page (workers, applications)."""
        url = f"http://127.0.0.1:{self.ui_port}/json/"
        with urllib.request.urlopen(url, timeout=5) as answer:
            result: dict[str, Any] = json.loads(answer.read())
        return result

    def alive_workers(self) -> int:
        try:
            workers = self.state().get("workers", [])
        except (OSError, ValueError, urllib.error.URLError):
            return 0
        return sum(1 for w in workers if w.get("state") == "ALIVE")

    def wait_alive(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while self.alive_workers() < self.workers:
            dead = [d.name for d in self.daemons if d.process and d.process.poll() is not None]
            if dead or time.monotonic() > deadline:
                why = f"{', '.join(dead)} exited" if dead else f"not up after {timeout_s:.0f}s"
                raise ClusterError(f"standalone cluster: {why} (logs in {self.root})")
            time.sleep(0.5)

    def stop(self) -> None:
        """Workers first (their executors with them), then the master."""
        for daemon in reversed(self.daemons):
            daemon.stop()
        self.daemons.clear()

    def executor_logs(self) -> list[Path]:
        """The executors' stderr files under the workers' work directories."""
        return sorted(self.root.glob("worker-*/app-*/*/stderr"))


@contextmanager
def standalone_cluster(root: Path, workers: int = 2) -> Iterator[StandaloneCluster]:
    """A started cluster, stopped by process id on the way out."""
    cluster = StandaloneCluster(root, workers)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()
