"""The nightly job derived from the declarations, against a real broker and a local Spark.

Random records go through the pipelines in a :class:`streams.testing.TestDriver` (the
engine's own batch functions, over an in-memory log); the source records are then
produced to a real broker, partition by partition, and so are the changelogs the driver's
tables wrote: these stand in for the workers' changelogs until the workers are wired to
the streams API. The job must recompute every table of the demo pipelines, of a user's
pipeline module (windows of three kinds, a global table joined as of event time, a
grace), of one with three windows with a grace over one source, and of a batch function
that declares its replay equal to the driver's, list the batch function that declares
nothing as not recomputed, find a changed live value and publish its corrections in the
contract's format.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from core.topics import POSITION_KEY, partition_for
from jobs.compare import same_value
from jobs.recompute import EXIT_DIFFERS, EXIT_SAME, Options, run
from streams.testing import TestDriver
from tables.engine import TP
from tables.windows import table_key
from tests.support.graces import WINDOWS
from tests.support.kafka import ROOT, TEST_PORT, LocalKafka, local_kafka
from tests.support.kafka_io import create_topics, publish, read_topic
from tests.support.pipelines import VIEWS
from tests.support.workloads import DEMO_MODULES, click_records, demo_records, page_view_records

pytestmark = [pytest.mark.batch, pytest.mark.integration]

PORT = TEST_PORT + 2000
PARTITIONS = 4
USER_MODULE = "tests.support.pipelines"
BATCH_MODULE = "tests.support.batch_pipelines"
GRACES_MODULE = "tests.support.graces"
MODULES = (*DEMO_MODULES, USER_MODULE, GRACES_MODULE, BATCH_MODULE)
HOUR_MS = 3_600_000


@pytest.fixture(scope="module")
def driver() -> TestDriver:
    """The pipelines run over random records of the last three hours (Kafka refuses
    record timestamps far ahead of its clock; windows stay within their retention)."""
    now = int(time.time() * 1000)
    found = TestDriver(*MODULES, partitions=PARTITIONS, now_ms=now, fetch_records=400)
    demo_records(found, seed=11, start_ms=now - 3 * HOUR_MS, steps=100)
    page_view_records(found, seed=12, start_ms=now - 2 * HOUR_MS, views=2000)
    click_records(found, seed=13, start_ms=now - 2 * HOUR_MS)
    for n in range(300):
        found.produce("deposits", {"amount": n % 9}, key=f"acct-{n % 13}", timestamp=now - n)
    found.run()
    return found


def changelog(table: str) -> str:
    return f"streamstate-{table}-changelog"


@pytest.fixture(scope="module")
def kafka(driver: TestDriver) -> Iterator[LocalKafka]:
    """A broker holding the driver's source records and its tables' changelogs (each
    partition's records in the driver's order, so at the driver's offsets)."""
    sources = sorted(driver.loaded.inputs)
    tables = sorted(driver.specs)
    with local_kafka("batch-declared", port=PORT) as cluster:
        create_topics(cluster.bootstrap, {t: PARTITIONS for t in sources})
        create_topics(
            cluster.bootstrap,
            {changelog(t): PARTITIONS for t in tables},
            {"cleanup.policy": "compact"},
        )
        create_topics(cluster.bootstrap, {"corrections": PARTITIONS})
        wanted = {*sources, *(changelog(t) for t in tables)}
        records = [
            r for tp, rs in sorted(driver.log.records.items()) if tp.topic in wanted for r in rs
        ]
        publish(cluster.bootstrap, records)
        yield cluster


def options(kafka: LocalKafka, out: Path, **more: Any) -> Options:
    return Options(
        bootstrap=kafka.bootstrap,
        out=out,
        master=None,
        settle_s=5.0,
        modules=MODULES,
        partitions=PARTITIONS,
        **more,
    )


def report(out: Path) -> dict[str, Any]:
    found: dict[str, Any] = orjson.loads((out / "report.json").read_bytes())
    return found


@pytest.fixture(scope="module")
def first_report(
    spark: Any, kafka: LocalKafka, tmp_path_factory: pytest.TempPathFactory
) -> tuple[int, dict[str, Any], Path]:
    out = tmp_path_factory.mktemp("declared")
    status = run(options(kafka, out), spark)
    return status, report(out), out


RECOMPUTED = {
    "word_counts",
    "inventory",
    "sales_by_category",
    "unsettled_sales",
    "views_per_user",
    "seconds_by_country",
    "sessions",
    *WINDOWS,
    "deposit_counts",
}


def test_every_declared_table_is_recomputed_equal_to_the_engines(
    first_report: tuple[int, dict[str, Any], Path], driver: TestDriver
) -> None:
    status, found, _ = first_report
    assert status == EXIT_SAME
    assert set(found["tables"]) == RECOMPUTED
    for name, entry in found["tables"].items():
        assert entry["keys_compared"] == len(driver.table(name)) > 0, name
        assert (entry["mismatched"], entry["missing_in_stream"], entry["missing_in_batch"]) == (
            0,
            0,
            0,
        ), name
        assert entry["recompute"]["pipelines"], name
    assert found["tables"]["word_counts"]["recompute"]["pipelines"] == [
        "words.word_counts-repartition",
        "words.word_counts",
    ]


def test_a_batch_function_without_a_recompute_is_reported_not_recomputed(
    first_report: tuple[int, dict[str, Any], Path],
) -> None:
    _, found, _ = first_report
    [entry] = found["not_recomputed"]
    assert (entry["table"], entry["pipeline"]) == ("balances", "balances")
    assert 'recompute="replay"' in entry["reason"]
    assert found["pipelines"]["balances"] == {"not_recomputed": entry["reason"]}
    assert found["pipelines"]["deposit_counts"] == {"stage": 0, "mode": "partitions"}
    assert found["pipelines"]["words.word_counts-repartition"] == {"stage": 0, "mode": "chunks"}


def test_the_views_hold_each_recomputed_table(
    first_report: tuple[int, dict[str, Any], Path], spark: Any, driver: TestDriver
) -> None:
    _, _, out = first_report
    words = {
        r["key"]: orjson.loads(r["value"])
        for r in spark.read.parquet(str(out / "word_counts")).collect()
    }
    assert words == driver.table("word_counts")
    sessions = spark.read.parquet(str(out / "sessions")).collect()
    expected = driver.table("sessions")
    assert {(r["key"], r["window_start"]) for r in sessions} == set(expected)
    for row in sessions:
        assert same_value(orjson.loads(row["value"]), expected[(row["key"], row["window_start"])])
        assert row["window_end"] > row["window_start"]


def test_above_the_local_rows_spark_reports_and_writes_what_the_driver_does(
    first_report: tuple[int, dict[str, Any], Path], spark: Any, kafka: LocalKafka, tmp_path: Path
) -> None:
    """With ``local_rows=0`` the later stages, the compare and the views run as Spark
    jobs: the same report and the same views as the driver's."""
    status, local, local_out = first_report
    assert run(options(kafka, tmp_path, local_rows=0), spark) == status
    found = report(tmp_path)
    for part in ("tables", "figures", "pipelines", "not_recomputed", "cut", "global_tables"):
        assert found[part] == local[part], part
    for name in local["tables"]:
        assert _view(spark, tmp_path / name) == _view(spark, local_out / name), name


def _view(spark: Any, folder: Path) -> list[tuple[Any, ...]]:
    frame = spark.read.parquet(str(folder))
    return [frame.columns, *sorted(tuple(row) for row in frame.collect())]


def test_the_command_line_reads_the_pipeline_modules_from_the_settings(
    kafka: LocalKafka, tmp_path: Path
) -> None:
    command = [sys.executable, "-m", "jobs.recompute", "--bootstrap", kafka.bootstrap]
    command += ["--out", str(tmp_path), "--master", "local[2]", "--shuffle-partitions", "4"]
    command += ["--settle-timeout", "5"]
    env = {
        **os.environ,
        "STREAMSTATE_PIPELINES": ",".join(DEMO_MODULES),
        "STREAMSTATE_EXTRA_PIPELINES": f"{USER_MODULE},{GRACES_MODULE},{BATCH_MODULE}",
        "STREAMSTATE_TOPIC_PARTITIONS": str(PARTITIONS),
    }
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == EXIT_SAME, done.stderr[-3000:]
    assert "no differences (exit 0)" in done.stdout
    assert "NOT RECOMPUTED: balances (balances)" in done.stdout
    assert set(report(tmp_path)["tables"]) == RECOMPUTED


def test_a_changed_live_value_is_found_and_repaired_in_the_contracts_format(
    spark: Any, kafka: LocalKafka, driver: TestDriver, tmp_path: Path
) -> None:
    words = driver.table("word_counts")
    word = sorted(words)[0]
    views = driver.table("views_per_user")
    user, start = sorted(views)[0]
    window = driver.specs["views_per_user"].window
    assert window is not None
    view_key = table_key(window, user, start)
    store = sorted(driver.table("inventory"))[0]
    now = int(time.time() * 1000)
    drift = [  # each in the partition of the key it was grouped by, as a worker writes it
        _Drift(changelog("word_counts"), word, word.encode(), orjson.dumps(words[word] + 5), now),
        _Drift(changelog("word_counts"), "phantom", b"phantom", b"1", now),
        _Drift(
            changelog("views_per_user"), user, view_key, orjson.dumps(views[(user, start)] + 1), now
        ),
        _Drift(changelog("inventory"), store, store.encode(), None, now),
    ]
    publish(kafka.bootstrap, drift)

    status = run(options(kafka, tmp_path, repair=True), spark)
    assert status == EXIT_DIFFERS
    tables = report(tmp_path)["tables"]
    counted = ("mismatched", "missing_in_stream", "missing_in_batch")
    assert tuple(tables["word_counts"][k] for k in counted) == (1, 0, 1)
    assert tuple(tables["views_per_user"][k] for k in counted) == (1, 0, 0)
    assert tuple(tables["inventory"][k] for k in counted) == (0, 1, 0)
    [example] = tables["views_per_user"]["examples"]
    assert example["window"]["start"] == start
    assert report(tmp_path)["corrections_published"] == 4

    sent = {
        (r.key, orjson.loads(r.value or b"null")["table"]): r
        for r in read_topic(kafka.bootstrap, "corrections")
    }
    assert orjson.loads(sent[(word.encode(), "word_counts")].value or b"") == {
        "table": "word_counts",
        "key": word,
        "value": words[word],
        "expected": words[word] + 5,
    }
    assert orjson.loads(sent[(b"phantom", "word_counts")].value or b"") == {
        "table": "word_counts",
        "key": "phantom",
        "value": None,
        "expected": 1,
    }
    windowed = orjson.loads(sent[(user.encode(), "views_per_user")].value or b"")
    assert windowed == {
        "table": "views_per_user",
        "key": user,
        "value": views[(user, start)],
        "expected": views[(user, start)] + 1,
        "window": {"start": start, "end": window.end(start)},
    }
    inventory = orjson.loads(sent[(store.encode(), "inventory")].value or b"")
    assert same_value(inventory["value"], driver.table("inventory")[store])
    assert inventory["expected"] is None
    assert POSITION_KEY not in {r.key for r in read_topic(kafka.bootstrap, "corrections")}
    # The compare run as Spark jobs finds the same differences and examples.
    on_spark = tmp_path / "on-spark"
    assert run(options(kafka, on_spark, local_rows=0), spark) == EXIT_DIFFERS
    assert report(on_spark)["tables"] == tables


class _Drift:
    """A changelog record as a drifted worker would write it: in the partition of the
    key its table groups by."""

    def __init__(self, topic: str, grouped: str, key: bytes, value: bytes | None, at: int) -> None:
        self.topic, self.key, self.value, self.timestamp = topic, key, value, at
        self.partition = partition_for(grouped.encode(), PARTITIONS)


def test_dead_letters_of_the_sources_are_counted_as_the_engine_counts_them(
    first_report: tuple[int, dict[str, Any], Path], driver: TestDriver
) -> None:
    figures = first_report[1]["figures"]
    assert figures["dead_letters:page-views"] == len(driver.dead_letters(VIEWS))
    assert figures["records:item-events"] == sum(
        len(rs) for tp, rs in driver.log.records.items() if tp.topic == "item-events"
    )
    assert TP("item-events", 0) in driver.log.records


def test_a_pipeline_whose_every_partition_joins_two_topics_is_recomputed(
    spark: Any, kafka: LocalKafka, driver: TestDriver, tmp_path: Path
) -> None:
    """Every partition number holds records of both settling topics: each is read into
    one Spark partition of its own, and the union of those reads must keep them apart
    (Spark 4 would otherwise merge single-partition inputs into one partition)."""
    from jobs.cut import Cut
    from jobs.declared import declare
    from jobs.stages import source_frame, source_reads

    settling = Options(
        bootstrap=kafka.bootstrap,
        out=tmp_path,
        master=None,
        settle_s=5.0,
        modules=("agents.settling",),
        partitions=PARTITIONS,
    )
    declared = declare(settling.spec(PARTITIONS, 0))
    ends = {
        topic: {p: len(driver.log.records.get(TP(topic, p), ())) for p in range(PARTITIONS)}
        for topic in ("item-events", "payments")
    }
    cut = Cut(sources=ends, changelogs={}, log_start={}, taken_at_ms=0, settled=True)
    reads = source_reads(cut, declared)
    assert len(reads.coalesced) == PARTITIONS
    assert (reads.alone, reads.chunks) == ({}, {})
    frame = source_frame(spark, kafka.bootstrap, cut, declared)
    assert frame is not None
    assert frame.rdd.getNumPartitions() == PARTITIONS
    status = run(settling, spark)
    assert status == EXIT_SAME
    entry = report(tmp_path)["tables"]["unsettled_sales"]
    assert entry["keys_compared"] == len(driver.table("unsettled_sales")) > 0
    assert entry["mismatched"] == entry["missing_in_stream"] == entry["missing_in_batch"] == 0
