"""The local Kafka for tests: started by ops/kafka.sh, stopped by its process ids."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.support.ports import require_free_port

ROOT = Path(__file__).resolve().parents[2]
#: The test process's number when pytest-xdist runs several (gw0, gw1, ...): each takes
#: its own block of ports (modules add offsets of their own, 500 apart or more).
WORKER = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
TEST_PORT = int(os.environ.get("STREAMSTATE_TEST_KAFKA_PORT", "21092")) + 100 * WORKER


@dataclass(frozen=True)
class LocalKafka:
    """A running local cluster."""

    port: int
    brokers: int
    directory: Path
    #: more broker properties (``key=value``), after ops/kafka.sh's own
    properties: tuple[str, ...] = ()

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{self.port + 2 * i}" for i in range(self.brokers))

    @property
    def broker_url(self) -> str:
        return ";".join(f"kafka://127.0.0.1:{self.port + 2 * i}" for i in range(self.brokers))

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "KAFKA_PORT": str(self.port),
            "KAFKA_BROKERS": str(self.brokers),
            "KAFKA_DIR": str(self.directory),
            "KAFKA_PROPERTIES": "\n".join(self.properties),
        }

    def up(self) -> None:
        started = subprocess.run(
            [str(ROOT / "ops/kafka.sh"), "up"], env=self.env(), capture_output=True, text=True
        )
        if started.returncode != 0:  # what the script printed, the broker's log tail included
            raise RuntimeError(
                f"ops/kafka.sh up (port {self.port}) exited {started.returncode}:\n"
                f"{started.stdout}{started.stderr}"
            )

    def down(self) -> None:
        subprocess.run([str(ROOT / "ops/kafka.sh"), "down"], env=self.env(), check=True)

    def kill(self) -> None:
        """Stop the nodes with SIGKILL: for a cluster whose data is deleted next."""
        subprocess.run([str(ROOT / "ops/kafka.sh"), "kill"], env=self.env(), check=True)

    def pids(self) -> list[int]:
        return [int(p.read_text()) for p in sorted(self.directory.glob("node-*/kafka.pid"))]


def running(pid: int) -> bool:
    """Whether a process runs. A broker's parent has exited, so once the broker exits it
    stays a zombie until init reaps it, which can take seconds: a zombie whose threads have
    all exited has stopped (a killed JVM's main thread is a zombie for a second or so while
    another thread still tears the process down, its sockets still open)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: os.kill's answer
        return True
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return not (fields["State"].split()[0] == "Z" and fields["Threads"].strip() == "1")


@contextmanager
def local_kafka(
    name: str, brokers: int = 1, port: int = TEST_PORT, properties: tuple[str, ...] = ()
) -> Iterator[LocalKafka]:
    """Start a fresh cluster in .cache/test-kafka/<name>-<port>, and stop it afterwards."""
    directory = ROOT / ".cache" / "test-kafka" / f"{name}-{port}"
    kafka = LocalKafka(port=port, brokers=brokers, directory=directory, properties=properties)
    kafka.kill()
    for node in range(brokers):
        require_free_port(port + 2 * node)
    shutil.rmtree(directory, ignore_errors=True)
    kafka.up()
    try:
        yield kafka
    finally:
        kafka.kill()
