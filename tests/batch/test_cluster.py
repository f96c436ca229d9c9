"""The nightly recompute on a Spark standalone cluster: a master and two one-core workers
started from the pyspark distribution on 127.0.0.1, each worker without the project's
Python (no PYSPARK_PYTHON, no virtualenv on its PATH, a work directory of its own).

The pipelines are the demo's and a user's module that lives outside the repository (in a
folder of its own on the driver's path). The job must ship its Python environment, the
project's modules and the user's module to the executors and give the report the local
master gives; with an executor Python that lacks what the replay imports it must stop
after its preflight with exit 2 and one line, writing nothing.

The live tables are the changelogs a TestDriver run wrote, with two words changed: they
stand in for the workers' (tests/batch/test_recompute_live.py runs real workers).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from core.topics import partition_for
from jobs import pyenv
from jobs.compare import same_value
from jobs.recompute import EXIT_DIFFERS, EXIT_PREFLIGHT, EXIT_SAME, Options, run
from jobs.session import jar_cache
from jobs.standalone import StandaloneCluster, node_env, spark_home
from streams.testing import TestDriver
from tests.support.kafka import ROOT, TEST_PORT, LocalKafka, local_kafka, running
from tests.support.kafka_io import create_topics, publish
from tests.support.workloads import DEMO_MODULES, demo_records

pytestmark = [pytest.mark.batch, pytest.mark.integration]

PARTITIONS = 4
USER_MODULE = "acme_pageviews"
HOUR_MS = 3_600_000


@pytest.fixture(scope="module")
def user_module(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A pipeline module outside the repository: the page views of
    tests/support/pipelines.py, as a file of its own in a folder on the driver's path."""
    folder = tmp_path_factory.mktemp("user-modules")
    source = (ROOT / "tests" / "support" / "pipelines.py").read_text()
    (folder / f"{USER_MODULE}.py").write_text(source)
    sys.path.insert(0, str(folder))
    try:
        yield folder
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop(USER_MODULE, None)


@pytest.fixture(scope="module")
def driver(user_module: Path) -> TestDriver:
    now = int(time.time() * 1000)
    found = TestDriver(*DEMO_MODULES, USER_MODULE, partitions=PARTITIONS, now_ms=now)
    demo_records(found, seed=21, start_ms=now - 2 * HOUR_MS, steps=60)
    for n in range(400):
        user = f"u{n % 17}"
        view = {"user": user, "page": f"/p{n % 5}", "ms": 100 * n, "ts": now - HOUR_MS + 7000 * n}
        found.produce("page-views", view, key=user, timestamp=now - HOUR_MS + 7000 * n)
    found.run()
    return found


@pytest.fixture(scope="module")
def kafka(driver: TestDriver) -> Iterator[LocalKafka]:
    """A broker with the driver's source records and its tables' changelogs, two words
    changed in the latter, and no worker (so the cut does not wait for one)."""
    with local_kafka("batch-cluster", port=TEST_PORT) as cluster:
        inputs = sorted(driver.loaded.inputs)
        changelogs = [f"streamstate-{t}-changelog" for t in sorted(driver.specs)]
        create_topics(cluster.bootstrap, {t: PARTITIONS for t in [*inputs, *changelogs]})
        wanted = {*inputs, *changelogs}
        records = [
            r for tp, rs in sorted(driver.log.records.items()) if tp.topic in wanted for r in rs
        ]
        publish(cluster.bootstrap, records)
        words = driver.table("word_counts")
        wrong = sorted(words)[0]
        drift = [
            (wrong.encode(), orjson.dumps(words[wrong] + 7)),
            (b"phantomword", b"5"),
        ]
        changed = [
            _Changed(key, value, partition_for(key, PARTITIONS), int(time.time() * 1000))
            for key, value in drift
        ]
        publish(cluster.bootstrap, changed)
        yield cluster


class _Changed:
    topic = "streamstate-word_counts-changelog"

    def __init__(self, key: bytes, value: bytes, partition: int, timestamp: int) -> None:
        self.key, self.value, self.partition, self.timestamp = key, value, partition, timestamp


@pytest.fixture(scope="module")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    cluster = StandaloneCluster(tmp_path_factory.mktemp("spark-standalone"), workers=2)
    cluster.start()
    pids = cluster.pids
    try:
        yield cluster
    finally:
        cluster.stop()
        alive = [pid for pid in pids if running(pid)]
        assert not alive, f"standalone daemons still running: {alive}"


def driver_env(user_module: Path) -> dict[str, str]:
    """The driver's environment: the project's Python, the pipeline modules in the
    settings, the user's module on the path, nothing naming the executors' Python."""
    env = {k: v for k, v in os.environ.items() if k != "PYSPARK_PYTHON"}
    return {
        **env,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": str(user_module),
        "STREAMSTATE_PIPELINES": ",".join(DEMO_MODULES),
        "STREAMSTATE_EXTRA_PIPELINES": USER_MODULE,
        "STREAMSTATE_TOPIC_PARTITIONS": str(PARTITIONS),
    }


def recompute(
    command: list[str], log: Path, user_module: Path, **env: str
) -> subprocess.CompletedProcess[str]:
    """The job in a process of its own (its own driver JVM); its output also in ``log``."""
    done = subprocess.run(
        command,
        cwd=ROOT,
        env={**driver_env(user_module), **env},
        capture_output=True,
        text=True,
        timeout=900,
    )
    log.write_text(f"$ {' '.join(command)}\n{done.stdout}\n{done.stderr}")
    return done


def job_args(kafka: LocalKafka, out: Path) -> list[str]:
    return ["--bootstrap", kafka.bootstrap, "--out", str(out), "--shuffle-partitions", "4"]


def load_report(out: Path) -> dict[str, Any]:
    report: dict[str, Any] = orjson.loads((out / "report.json").read_bytes())
    return report


@pytest.fixture(scope="module")
def local_report(
    spark: Any, kafka: LocalKafka, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("local-report")
    options = Options(
        bootstrap=kafka.bootstrap,
        out=out,
        master=None,
        settle_s=10.0,
        modules=(*DEMO_MODULES, USER_MODULE),
        partitions=PARTITIONS,
    )
    assert run(options, spark) == EXIT_DIFFERS
    return load_report(out)


def test_the_workers_run_without_the_projects_python(spark_cluster: StandaloneCluster) -> None:
    env = node_env(os.environ)
    assert "PYSPARK_PYTHON" not in env
    worker_python = shutil.which("python3", path=env["PATH"])
    assert worker_python is None or not Path(worker_python).resolve().is_relative_to(
        Path(sys.prefix).resolve()
    )
    assert spark_cluster.alive_workers() == 2
    work_dirs = {p.name for p in spark_cluster.root.iterdir() if p.is_dir()}
    assert work_dirs == {"worker-1", "worker-2"}


def test_the_cluster_report_equals_the_local_one(
    spark_cluster: StandaloneCluster,
    kafka: LocalKafka,
    local_report: dict[str, Any],
    user_module: Path,
    tmp_path: Path,
) -> None:
    command = [sys.executable, "-m", "jobs.recompute", "--master", spark_cluster.master_url]
    out = tmp_path / "out"
    done = recompute(command + job_args(kafka, out), tmp_path / "recompute.log", user_module)
    assert done.returncode == EXIT_DIFFERS, done.stderr[-3000:]
    assert f"with {pyenv.ARCHIVE_PYTHON} ({pyenv.SOURCE_ARCHIVE}" in done.stderr
    report = load_report(out)
    assert report["cut"] == local_report["cut"]
    assert same_value(report["tables"], local_report["tables"]), (report, local_report)
    assert set(report["tables"]) >= {"word_counts", "views_per_user", "sessions"}
    words = report["tables"]["word_counts"]
    assert (words["mismatched"], words["missing_in_stream"], words["missing_in_batch"]) == (1, 0, 1)
    for name, entry in report["tables"].items():
        if name != "word_counts":
            assert entry["keys_compared"] > 0, name
            assert entry["mismatched"] == entry["missing_in_batch"] == 0, name
    # Both workers' executors unpacked the job's environment and got the user's module.
    unpacked = spark_cluster.root.glob(f"worker-*/app-*/*/{pyenv.ARCHIVE_LINK}/bin/python")
    assert {p.relative_to(spark_cluster.root).parts[0] for p in unpacked} == {
        "worker-1",
        "worker-2",
    }
    shipped = spark_cluster.root.glob(f"worker-*/app-*/*/{USER_MODULE}.py")
    assert {p.relative_to(spark_cluster.root).parts[0] for p in shipped} == {
        "worker-1",
        "worker-2",
    }


def test_under_spark_submit_the_executors_get_the_environment_and_the_modules(
    spark_cluster: StandaloneCluster, user_module: Path, tmp_path: Path
) -> None:
    jars = sorted(jar_cache().glob("*.jar"))
    command = [str(spark_home() / "bin" / "spark-submit"), "--master", spark_cluster.master_url]
    command += ["--jars", ",".join(str(j) for j in jars), str(ROOT / "jobs" / "recompute.py")]
    # spark-submit starts the driver with this Python; the executors get the job's own.
    done = recompute(
        [*command, "--preflight-only"],
        tmp_path / "spark-submit.log",
        user_module,
        PYSPARK_DRIVER_PYTHON=sys.executable,
    )
    output = done.stdout + done.stderr  # spark-submit sends the driver's stderr to stdout
    assert done.returncode == EXIT_SAME, output[-3000:]
    assert f"with {pyenv.ARCHIVE_PYTHON} ({pyenv.SOURCE_ARCHIVE}" in output
    assert "imported the job's modules and the pipeline modules" in output
    assert "has been added already" not in output  # spark-submit's --jars are kept


def test_an_executor_python_without_the_replays_modules_fails_the_preflight(
    spark_cluster: StandaloneCluster, kafka: LocalKafka, user_module: Path, tmp_path: Path
) -> None:
    bare = tmp_path / "bare-python"
    subprocess.run([str(pyenv.base_python()), "-m", "venv", "--without-pip", str(bare)], check=True)
    out = tmp_path / "out"
    command = [sys.executable, "-m", "jobs.recompute", "--master", spark_cluster.master_url]
    command += ["--python-env", str(bare / "bin" / "python")]
    done = recompute(command + job_args(kafka, out), tmp_path / "recompute.log", user_module)
    assert done.returncode == EXIT_PREFLIGHT, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("recompute: preflight failed: the executors' Python")
    assert "cannot import" in last
    assert "pyarrow" in last
    assert "fix: install what provides" in last
    assert "Traceback" not in done.stderr
    assert not (out / "report.json").exists()
    assert not any(out.glob("*/*.parquet"))
