"""Worker processes for integration tests: started with the contract's command line,
stopped by process id."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.kafka import ROOT, LocalKafka

#: Partitions of every topic the workers create.
TOPIC_PARTITIONS = 8


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def cpu_from_stat(stat: str, ticks_per_s: int) -> float:
    """User plus system CPU seconds of a ``/proc/<pid>/stat`` text."""
    # utime and stime are the 14th and 15th fields; the 3rd field follows the ")"
    fields = stat.rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / ticks_per_s


def cpu_seconds(pid: int | None) -> float | None:
    """User and system CPU seconds process ``pid`` has used so far (Linux /proc); None
    when it cannot be read. Unlike wall time, hardly changed by other processes' load."""
    if pid is None:
        return None
    try:
        return cpu_from_stat(Path(f"/proc/{pid}/stat").read_text(), os.sysconf("SC_CLK_TCK"))
    except OSError:
        return None


@dataclass
class Worker:
    """One `faust worker` process of the streamstate app."""

    kafka: LocalKafka
    datadir: Path
    port: int = field(default_factory=free_port)
    extra_env: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Worker:
        self.datadir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.datadir.parent / f"{self.datadir.name}-{self.port}.log"
        env = {
            **os.environ,
            "BROKER_URL": self.kafka.broker_url,
            "TOPIC_PARTITIONS": str(TOPIC_PARTITIONS),
            "PYTHONUNBUFFERED": "1",
            **self.extra_env,
        }
        command = [
            str(ROOT / ".venv/bin/faust"),
            "--datadir",
            str(self.datadir),
            "-A",
            "app.main",
            "worker",
            "-l",
            "info",
            "--web-host",
            "127.0.0.1",
            "--web-port",
            str(self.port),
        ]
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
            )
        return self

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def get(self, path: str, timeout: float = 5.0) -> tuple[int, Any]:
        """GET a path of this worker's API: (status, decoded JSON or text)."""
        request = urllib.request.Request(self.url + path)
        try:
            with urllib.request.urlopen(request, timeout=timeout) as answer:
                body = answer.read()
                status = answer.status
        except urllib.error.HTTPError as error:
            body, status = error.read(), error.code
        try:
            return status, json.loads(body)
        except ValueError:
            return status, body.decode("utf-8", "replace")

    def wait_until(self, path: str, status: int = 200, timeout: float = 90.0) -> Any:
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(f"worker on {self.port} exited:\n{self.log_tail()}")
            try:
                code, body = self.get(path, timeout=2.0)
                if code == status:
                    return body
                last = (code, body)
            except OSError as error:
                last = error
            time.sleep(0.3)
        raise TimeoutError(f"{self.url}{path} never gave {status}: {last}\n{self.log_tail()}")

    def wait_ready(self, timeout: float = 120.0) -> None:
        self.wait_until("/ready", 200, timeout)

    def log_tail(self, lines: int = 40) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def log_text(self) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout: float = 30.0) -> bool:
        """Stop gracefully (SIGTERM), by process id; kill if it hangs. False when it had
        to be killed."""
        self.terminate()
        return self.wait_stopped(timeout)

    def terminate(self) -> None:
        """Send SIGTERM, by process id, if the process runs."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)

    def wait_stopped(self, timeout: float = 30.0) -> bool:
        """Wait for a terminated process to end; kill it if it hangs. False when it had
        to be killed."""
        if self.process is None:
            return True
        stopped = True
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
            stopped = False
        self.process = None
        return stopped

    def kill9(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        self.process = None


def stop_workers(workers: Iterable[Worker], timeout: float = 30.0) -> list[Worker]:
    """Stop every worker at once: SIGTERM to each, then wait for each (one after the
    other, each stop takes a second or two). The ones that had to be killed."""
    running = list(workers)
    for worker in running:
        worker.terminate()
    return [worker for worker in running if not worker.wait_stopped(timeout)]
