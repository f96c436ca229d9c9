"""The nightly recompute on a Spark standalone cluster: a master and two one-core workers
started from the pyspark distribution on 127.0.0.1, each worker without the project's
Python (no PYSPARK_PYTHON, no virtualenv on its PATH, a work directory of its own).

The job must ship its own Python environment to the executors and give the report the
local master gives; with an executor Python that lacks the UDFs' modules it must stop
after its preflight with exit 2 and one line, writing nothing.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaProducer
from core.semantics import HOUR_MS, tokenize

from core.admin import ensure_topics
from core.topics import TopicSpec, partition_for, topic_specs
from jobs import compare, pyenv
from jobs.recompute import EXIT_DIFFERS, EXIT_PREFLIGHT, EXIT_SAME, Options, run
from jobs.session import jar_cache, udf_jar
from jobs.standalone import StandaloneCluster, node_env, spark_home
from ops.generator import SENTENCES, Catalogue, item_event
from tests.support.kafka import ROOT, TEST_PORT, LocalKafka, local_kafka, running

pytestmark = [pytest.mark.batch, pytest.mark.integration]

PARTITIONS = 8
Record = tuple[str, bytes | None, bytes | None]
#: Lines the Java tokeniser and Python's rules must split alike.
UNICODE_LINES = ["İstanbul ǅemal ﬁne x²³ ٣٤ 東京タワー", "O'Brien's café: ÉTAT, État; straße"]


def send(bootstrap: str, records: list[Record], timestamp_ms: int | None = None) -> None:
    async def go() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
        await producer.start()
        try:
            for topic, key, value in records:
                partition = None if key is None or "changelog" not in topic else _part(key)
                await producer.send(
                    topic, value, key=key, partition=partition, timestamp_ms=timestamp_ms
                )
            await producer.flush()
        finally:
            await producer.stop()

    asyncio.run(go())


def _part(key: bytes) -> int:
    return partition_for(key, PARTITIONS)


def source_records(
    rng: random.Random, catalogue: Catalogue, now: int
) -> tuple[list[Record], Counter[str]]:
    """Item events and text lines, some in the plain JSON form the JVM parses and some
    outside it (escaped strings), which Python UDFs on the executors parse; and the word
    counts of the lines."""
    records: list[Record] = []
    words: Counter[str] = Counter()
    for n in range(400):
        event = item_event(rng, catalogue, now - rng.randint(0, 2 * HOUR_MS))
        if n % 10 == 0:
            event["event_id"] = f"évènement-{n}"  # json.dumps escapes it
            value = json.dumps(event).encode()
        else:
            value = orjson.dumps(event)
        records.append(("item-events", event["store_id"].encode(), value))
        line = (SENTENCES + UNICODE_LINES)[n % (len(SENTENCES) + len(UNICODE_LINES))]
        records.append(("text-lines", None, line.encode()))
        words.update(tokenize(line))
    records += [  # what the stream sends to its DLQ, and the batch skips
        ("text-lines", None, b"\xff\xfe not UTF-8"),
        ("item-events", b"store-001", b'{"event_id": "x", "kind": "sale"}'),
    ]
    return records, words


def changelog_records(words: Counter[str]) -> list[Record]:
    """Live values written straight into the changelogs: one equal, one wrong and one
    phantom word, a wrong store: every status of the comparison."""
    right, wrong = words.most_common(2)
    inventory = {"store_id": "store-001", "on_hand": {"X": 1}, "updated_at": 1}
    return [
        ("streamstate-word_counts-changelog", right[0].encode(), str(right[1]).encode()),
        ("streamstate-word_counts-changelog", wrong[0].encode(), str(wrong[1] + 7).encode()),
        ("streamstate-word_counts-changelog", b"phantomword", b"5"),
        ("streamstate-inventory-changelog", b"store-001", orjson.dumps(inventory)),
    ]


@pytest.fixture(scope="module")
def kafka() -> Iterator[LocalKafka]:
    """A broker with the source topics, their records and the live tables' changelogs,
    and no worker (so the cut does not wait for one)."""
    with local_kafka("batch-cluster", port=TEST_PORT) as cluster:
        changelogs = [
            TopicSpec(spec.changelog, PARTITIONS, {"cleanup.policy": "compact"})
            for spec in compare.specs("streamstate").values()
        ]
        asyncio.run(ensure_topics(cluster.bootstrap, topic_specs(PARTITIONS, -1) + changelogs, 1))
        rng = random.Random(11)
        catalogue = Catalogue.build(rng)
        now = int(time.time() * 1000)
        products = [
            ("products", sku.encode(), orjson.dumps(p)) for sku, p in catalogue.products.items()
        ]
        renamed = {**catalogue.products["DAI-0000"], "name": "crème fraîche"}
        products.append(("products", b"DAI-0000", json.dumps(renamed).encode()))
        send(cluster.bootstrap, products, timestamp_ms=now - 3 * HOUR_MS)
        records, words = source_records(rng, catalogue, now)
        send(cluster.bootstrap, records + changelog_records(words))
        yield cluster


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


def driver_env() -> dict[str, str]:
    """The driver's environment: the project's Python, nothing naming the executors'."""
    env = {k: v for k, v in os.environ.items() if k != "PYSPARK_PYTHON"}
    return {**env, "SPARK_LOCAL_IP": "127.0.0.1", "PYTHONUNBUFFERED": "1"}


def recompute(command: list[str], log: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """The job in a process of its own (its own driver JVM); its output also in ``log``."""
    done = subprocess.run(
        command,
        cwd=ROOT,
        env={**driver_env(), **env},
        capture_output=True,
        text=True,
        timeout=540,
    )
    log.write_text(f"$ {' '.join(command)}\n{done.stdout}\n{done.stderr}")
    return done


def job_args(kafka: LocalKafka, out: Path) -> list[str]:
    return ["--bootstrap", kafka.bootstrap, "--out", str(out), "--shuffle-partitions", "4"]


def load_report(out: Path) -> dict[str, Any]:
    report: dict[str, Any] = orjson.loads((out / "report.json").read_bytes())
    return report


def same(a: Any, b: Any) -> bool:
    """Equal JSON values, floats within the comparison's revenue tolerance (a sum's
    rounding depends on the order of its terms, which differs between the masters)."""
    if isinstance(a, float) or isinstance(b, float):
        return (
            isinstance(a, int | float)
            and isinstance(b, int | float)
            and math.isclose(a, b, rel_tol=compare.REVENUE_TOLERANCE)
        )
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


@pytest.fixture(scope="module")
def local_report(
    spark: Any, kafka: LocalKafka, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("local-report")
    options = Options(bootstrap=kafka.bootstrap, out=out, master=None, settle_s=10.0)
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
    tmp_path: Path,
) -> None:
    command = [sys.executable, "-m", "jobs.recompute", "--master", spark_cluster.master_url]
    out = tmp_path / "out"
    done = recompute(command + job_args(kafka, out), tmp_path / "recompute.log")
    assert done.returncode == EXIT_DIFFERS, done.stderr[-3000:]
    assert f"with {pyenv.ARCHIVE_PYTHON} ({pyenv.SOURCE_ARCHIVE}" in done.stderr
    assert "records outside the plain JSON form, parsed in Python" in done.stderr
    report = load_report(out)
    assert report["cut"] == local_report["cut"]
    assert same(report["tables"], local_report["tables"]), (report["tables"], local_report)
    words = report["tables"]["word_counts"]
    assert (words["mismatched"], words["missing_in_batch"]) == (1, 1)
    differing = words["mismatched"] + words["missing_in_stream"] + words["missing_in_batch"]
    assert words["keys_compared"] - differing == 1  # the word whose live count is right
    # Both workers' executors unpacked the job's environment.
    unpacked = spark_cluster.root.glob(f"worker-*/app-*/*/{pyenv.ARCHIVE_LINK}/bin/python")
    assert {p.relative_to(spark_cluster.root).parts[0] for p in unpacked} == {
        "worker-1",
        "worker-2",
    }


def test_under_spark_submit_the_executors_get_the_environment_and_the_udfs(
    spark_cluster: StandaloneCluster, tmp_path: Path
) -> None:
    udfs = udf_jar()
    assert udfs is not None
    jars = [*sorted(jar_cache().glob("*.jar")), udfs]
    command = [str(spark_home() / "bin" / "spark-submit"), "--master", spark_cluster.master_url]
    command += ["--jars", ",".join(str(j) for j in jars), str(ROOT / "jobs" / "recompute.py")]
    # spark-submit starts the driver with this Python; the executors get the job's own.
    done = recompute(
        [*command, "--preflight-only"],
        tmp_path / "spark-submit.log",
        PYSPARK_DRIVER_PYTHON=sys.executable,
    )
    output = done.stdout + done.stderr  # spark-submit sends the driver's stderr to stdout
    assert done.returncode == EXIT_SAME, output[-3000:]
    assert f"with {pyenv.ARCHIVE_PYTHON} ({pyenv.SOURCE_ARCHIVE}" in output
    assert "the Java UDFs loaded" in output
    assert "has been added already" not in output  # spark-submit's --jars are kept


def test_an_executor_python_without_the_udfs_modules_fails_the_preflight(
    spark_cluster: StandaloneCluster, kafka: LocalKafka, tmp_path: Path
) -> None:
    bare = tmp_path / "bare-python"
    subprocess.run([str(pyenv.base_python()), "-m", "venv", "--without-pip", str(bare)], check=True)
    out = tmp_path / "out"
    command = [sys.executable, "-m", "jobs.recompute", "--master", spark_cluster.master_url]
    command += ["--python-env", str(bare / "bin" / "python")]
    done = recompute(command + job_args(kafka, out), tmp_path / "recompute.log")
    assert done.returncode == EXIT_PREFLIGHT, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("recompute: preflight failed: the executors' Python")
    assert "cannot import orjson, pyarrow, pydantic" in last
    assert "fix: pip install pyarrow pydantic orjson" in last
    assert "Traceback" not in done.stderr
    assert not (out / "report.json").exists()
    assert not any(out.glob("*/*.parquet"))
