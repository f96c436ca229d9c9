"""Processes of a run: faust workers started with the contract's command line, stopped
by process id, and the HTTP probes that wait for them."""

from __future__ import annotations

import asyncio
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.config import PARTITIONS, ROOT
from tests.support.workers import cpu_seconds

#: The project's faust app and the consumer group its workers form.
PROJECT_APP = "app.main"
PROJECT_GROUP = "streamstate"


def peak_rss_from_status(status: str) -> int | None:
    """The peak resident set size in bytes (``VmHWM``) of a ``/proc/<pid>/status`` text."""
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            value, unit = line.split()[1:3]
            return int(value) * {"kB": 1024, "mB": 1024**2, "gB": 1024**3}[unit]
    return None


def peak_rss(pid: int) -> int | None:
    """The peak resident set size in bytes of a running process, or None if unknown."""
    try:
        return peak_rss_from_status(Path(f"/proc/{pid}/status").read_text())
    except OSError:
        return None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def http_get(url: str, timeout: float = 5.0) -> tuple[int, Any]:
    """GET ``url``: (status, decoded JSON or text); status 0 when nothing answered."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            body, status = answer.read(), answer.status
    except urllib.error.HTTPError as error:
        body, status = error.read(), error.code
    except (OSError, ValueError):
        return 0, None
    try:
        return status, json.loads(body)
    except ValueError:
        return status, body.decode("utf-8", "replace")


@dataclass
class Worker:
    """One ``faust worker`` process: the project's (``app.main``) or a baseline's app."""

    broker_url: str
    datadir: Path
    app: str = PROJECT_APP
    port: int = field(default_factory=free_port)
    env: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.datadir.parent / f"{self.datadir.name}.log"

    def start(self) -> Worker:
        self.datadir.mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            "BROKER_URL": self.broker_url,
            "TOPIC_PARTITIONS": str(PARTITIONS),
            "PYTHONUNBUFFERED": "1",
            **self.env,
        }
        faust = str(Path(sys.executable).parent / "faust")
        command = [faust, "--datadir", str(self.datadir), "-A", self.app, "worker", "-l", "info"]
        command += ["--web-host", "127.0.0.1", "--web-port", str(self.port)]
        with self.log_path.open("ab") as log:
            self.started_at = time.monotonic()
            self.process = subprocess.Popen(
                command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
            )
        return self

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def peak_rss(self) -> int | None:
        """The process's peak resident set size so far, in bytes."""
        return peak_rss(self.process.pid) if self.alive() and self.process else None

    def cpu_seconds(self) -> float | None:
        """The CPU seconds the process has used so far."""
        return cpu_seconds(self.process.pid) if self.alive() and self.process else None

    def get(self, path: str, timeout: float = 5.0) -> tuple[int, Any]:
        return http_get(self.url + path, timeout)

    def wait_ready(self, timeout: float, interval: float = 0.1) -> float:
        """Wait for ``/ready`` 200; return the seconds since the process started."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(f"worker {self.url} exited:\n{self.log_tail()}")
            if self.get("/ready", timeout=2.0)[0] == 200:
                return time.monotonic() - self.started_at
            time.sleep(interval)
        raise TimeoutError(f"{self.url}/ready not 200 after {timeout:.0f} s\n{self.log_tail()}")

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM by process id, SIGKILL if it does not stop in time."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self.process = None
        if self.app == PROJECT_APP:
            self.leave_group()

    def leave_group(self) -> None:
        """Remove the stopped project worker's static membership from its group. A static
        member does not leave the group when it stops, and the next run's rewind of the
        group's offsets would otherwise wait for its session to expire."""
        from tables.faust_adapter import remove_static_members

        bootstrap = self.broker_url.removeprefix("kafka://")
        with contextlib.suppress(Exception):  # gone already, or the broker is down
            asyncio.run(remove_static_members(bootstrap, PROJECT_GROUP, [self.url]))

    def kill9(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        self.process = None


def run_module(module: str, args: list[str], timeout: float, log: Path) -> tuple[int, str, float]:
    """Run ``python -m module args``; (exit status, stdout, wall seconds). stderr to ``log``.

    The module runs in its own process group, so that on timeout its children (Spark's
    JVM) are stopped with it; the exit status is then -9.
    """
    started = time.monotonic()
    with log.open("ab") as err:
        child = subprocess.Popen(
            [sys.executable, "-m", module, *args],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=err,
            start_new_session=True,
        )
        try:
            out, _ = child.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            out, _ = child.communicate()
            return -9, "", time.monotonic() - started
    return child.returncode, out.decode("utf-8", "replace"), time.monotonic() - started
