"""The Kafka Streams baseline (bench/baselines/kstreams/): built on first use into the
git-ignored .cache/, run as one JVM per measured run.

The build is ``mvn package`` of the Maven project against kafka-streams of the broker's
version (ops/kafka/pom.xml), with its runtime jars copied beside it, into
``.cache/kstreams-<version>-<digest of the sources>/``: a changed source builds anew.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from bench.config import ROOT
from bench.procs import peak_rss

PROJECT = ROOT / "bench" / "baselines" / "kstreams"
MAIN_CLASS = "streamstate.kstreams.Main"
#: Kafka Streams commits on an interval; the project once per batch cycle. The scenarios
#: give Kafka Streams the project's mean commit interval of the same run and guarantee
#: (:func:`commit_interval_ms`); BENCH_KSTREAMS_COMMIT_MS sets one instead.
COMMIT_MS_SETTING = os.environ.get("BENCH_KSTREAMS_COMMIT_MS")
#: When the project's interval is not known (its run failed or was too short).
COMMIT_MS = 1000
HEAP = os.environ.get("BENCH_KSTREAMS_HEAP", "1g")
#: More JVM options, e.g. a flight recording: -XX:StartFlightRecording=filename=ks.jfr
JAVA_OPTIONS = os.environ.get("BENCH_KSTREAMS_JAVA_OPTS", "").split()
#: Kafka Streams settings over the defaults, ``name=value,...`` (for experiments; the
#: bench's figures are measured with none).
EXTRA_CONFIG = os.environ.get("BENCH_KSTREAMS_CONFIG", "")
AT_LEAST_ONCE, EXACTLY_ONCE = "at_least_once", "exactly_once_v2"


def commit_interval_ms(project_ms: float | None) -> int:
    """Kafka Streams' commit.interval.ms: BENCH_KSTREAMS_COMMIT_MS if set, else the
    project's mean commit interval (within 10 ms to 30 s), else :data:`COMMIT_MS`."""
    if COMMIT_MS_SETTING:
        return int(COMMIT_MS_SETTING)
    if project_ms is None:
        return COMMIT_MS
    return int(min(30_000, max(10, round(project_ms))))


def kafka_version() -> str:
    pom = (ROOT / "ops" / "kafka" / "pom.xml").read_text()
    start = pom.find("<kafka.version>") + len("<kafka.version>")
    return pom[start : pom.find("</kafka.version>")]


def source_digest(project: Path = PROJECT) -> str:
    """A digest of the pom and every main source file (not the tests)."""
    digest = hashlib.sha256()
    files = [project / "pom.xml", *sorted((project / "src" / "main").rglob("*"))]
    for path in files:
        if path.is_file():
            digest.update(str(path.relative_to(project)).encode() + b"\0")
            digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def build_dir(version: str | None = None) -> Path:
    return ROOT / ".cache" / f"kstreams-{version or kafka_version()}-{source_digest()}"


def classpath() -> str:
    """The baseline's classpath, built first if this version of the sources is not."""
    out = build_dir()
    if not (out / ".complete").exists():
        build(out, kafka_version())
    return os.pathsep.join([str(out / "build" / "kstreams-baseline-1.jar"), str(out / "lib" / "*")])


def build(out: Path, version: str) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise RuntimeError("mvn not found on PATH: the Kafka Streams baseline cannot be built")
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    command = [
        mvn, "-q", "-B", "-Dstyle.color=never", "-f", str(PROJECT / "pom.xml"),
        f"-Dkafka.version={version}", f"-Dkstreams.buildDir={out / 'build'}", "-DskipTests",
        "package", "dependency:copy-dependencies", "-DincludeScope=runtime",
        f"-DoutputDirectory={out / 'lib'}",
    ]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"building the Kafka Streams baseline failed:\n{done.stdout[-3000:]}")
    (out / ".complete").touch()


@dataclass
class KStreamsApp:
    """One Kafka Streams application (a topology of the baseline) in a JVM of its own."""

    topology: str
    bootstrap: str
    application_id: str
    guarantee: str
    work: Path
    commit_ms: int = COMMIT_MS
    heap: str = HEAP
    process: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    #: The JVM's peak resident set size, read just before it stopped.
    peak_rss_bytes: int | None = None
    commands: list[str] = field(default_factory=list)

    @property
    def group(self) -> str:
        """Its consumer group: the application id."""
        return self.application_id

    @property
    def log_path(self) -> Path:
        return self.work / f"{self.application_id}.log"

    def repartition_topic(self, name: str) -> str:
        return f"{self.application_id}-{name}-repartition"

    def start(self) -> KStreamsApp:
        self.work.mkdir(parents=True, exist_ok=True)
        state = self.work / f"{self.application_id}-state"
        shutil.rmtree(state, ignore_errors=True)
        command = [
            "java", f"-Xmx{self.heap}", "-XX:+UseG1GC", "-Djava.awt.headless=true",
            *JAVA_OPTIONS, "-cp", classpath(), MAIN_CLASS,
            "--topology", self.topology, "--bootstrap", self.bootstrap,
            "--application-id", self.application_id, "--guarantee", self.guarantee,
            "--commit-ms", str(self.commit_ms), "--state-dir", str(state),
            "--config", EXTRA_CONFIG,
        ]  # fmt: skip
        with self.log_path.open("ab") as log:
            self.started_at = time.monotonic()
            self.process = subprocess.Popen(
                command, cwd=ROOT, stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT
            )
        return self

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def _send(self, command: str) -> None:
        assert self.process is not None
        assert self.process.stdin is not None
        self.process.stdin.write(command.encode() + b"\n")
        self.process.stdin.flush()

    def dump(self, timeout: float = 120.0) -> dict[str, Any]:
        """The application's tables, as the JVM writes them (``Dump.java``)."""
        path = self.work / f"{self.application_id}-tables.json"
        path.unlink(missing_ok=True)
        self._send(f"dump {path}")
        deadline = time.monotonic() + timeout
        while not path.exists():
            if not self.alive():
                raise RuntimeError(f"Kafka Streams exited before its dump:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"no dump of {self.application_id} after {timeout:.0f} s")
            time.sleep(0.1)
        tables: dict[str, Any] = orjson.loads(path.read_bytes())
        return tables

    def stop(self, timeout: float = 60.0) -> None:
        """End of input, then SIGTERM, then SIGKILL, by process id."""
        if self.process is None:
            return
        if self.alive():
            self.peak_rss_bytes = peak_rss(self.process.pid)
            try:
                assert self.process.stdin is not None
                self.process.stdin.close()
                self.process.wait(timeout)
            except (OSError, subprocess.TimeoutExpired):
                self.process.send_signal(signal.SIGTERM)
                try:
                    self.process.wait(30)
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self.process.wait(10)
        self.process = None
