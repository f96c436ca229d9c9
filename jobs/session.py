"""The Spark session of the batch job, with Spark's Kafka source on its classpath, and
on a cluster the project's modules and the pipeline modules shipped to the executors.

The connector (``spark-sql-kafka-0-10``, the version of the installed pyspark) is resolved
from Maven Central by ``jobs/pom.xml`` once, into ``.cache/spark-jars-<version>/``, and
passed as ``spark.jars``: Spark's own ``spark.jars.packages`` resolver does not read
Maven's settings. An image that copied the connector into pyspark's own ``jars/`` folder
needs neither.

The executors run the pipelines' own functions (``jobs/tasks.py``), so they import the
project's packages and every pipeline module: on a local master they have the driver's
interpreter and path; on a cluster the session ships them with ``addPyFile`` (one zip of
the project's packages, and the modules named in the settings that live outside it), and
their dependencies come with the packed environment (``jobs/pyenv.py``).
"""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
import tempfile
import warnings
import zipfile
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

from jobs import pyenv

ROOT = Path(__file__).resolve().parents[1]
POM = Path(__file__).resolve().parent / "pom.xml"
CONNECTOR = "spark-sql-kafka-0-10"
#: The job's scheduler pools (one per thread that submits Spark jobs).
SCHEDULER_POOLS = Path(__file__).resolve().parent / "fairscheduler.xml"
#: With a byte limit on the Arrow batches that go to the Python workers, Spark measures
#: the batch after every row it adds (``BatchedPythonArrowInput``; 64 MB by default):
#: in the bench's recompute that took 13% of the JVM's samples. Only ``Int.MaxValue``
#: turns the check off; the job's own record limit then bounds a batch (docs/operations.md
#: gives the memory that makes). An operator whose records are large sets a byte limit
#: with ``--conf``.
ARROW_MAX_BYTES_KEY = "spark.sql.execution.arrow.maxBytesPerBatch"
NO_ARROW_BYTE_LIMIT = 2**31 - 1
#: Records per Arrow batch (one replay cycle each): set, not left to Spark's default, since
#: it is the only bound of a batch's memory once the byte limit is off.
ARROW_MAX_RECORDS_KEY = "spark.sql.execution.arrow.maxRecordsPerBatch"
ARROW_MAX_RECORDS = 10_000


class SparkSetupError(RuntimeError):
    """The Kafka connector jars could not be found or resolved."""


def spark_version() -> str:
    import pyspark

    return str(pyspark.__version__)


def pyspark_jars() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent / "jars"


def bundled_connector() -> bool:
    """Whether pyspark's own jars folder already holds the Kafka source."""
    return any(pyspark_jars().glob(f"{CONNECTOR}_*.jar"))


#: The connector's jars that pyspark lacks, as an image copies them into its jars folder
#: (ops/docker/spark_jars.py).
CONNECTOR_ARTIFACTS = (
    CONNECTOR,
    "spark-token-provider-kafka-0-10",
    "kafka-clients",
    "commons-pool2",
)


def bundled_connector_jars() -> list[Path]:
    """The connector's jars in pyspark's own jars folder. They are on this driver's
    classpath, not on a cluster's: a non-local master gets them as ``spark.jars``."""
    return sorted(
        jar
        for artifact in CONNECTOR_ARTIFACTS
        for jar in pyspark_jars().glob(f"{artifact}*.jar")
        if re.fullmatch(rf"{re.escape(artifact)}(_[\d.]+)?-\d[^/]*\.jar", jar.name)
    )


def job_jars(local: bool) -> list[Path]:
    """The jars the session ships (``spark.jars``): a local master loads what pyspark's
    jars folder holds by itself; a cluster's executors are sent the connector."""
    bundled = bundled_connector()
    return [] if bundled and local else bundled_connector_jars() if bundled else resolve_jars()


def jar_cache(version: str | None = None) -> Path:
    return ROOT / ".cache" / f"spark-jars-{version or spark_version()}"


def resolve_jars(cache: Path | None = None) -> list[Path]:
    """The connector jars, resolved with Maven on first use (then cached)."""
    version = spark_version()
    cache = cache or jar_cache(version)
    marker = cache / ".complete"
    if not marker.exists():
        print(f"recompute: resolving {CONNECTOR} {version} with Maven", file=sys.stderr)
        command = [
            "mvn",
            "-q",
            "-B",
            "-Dstyle.color=never",
            "-f",
            str(POM),
            f"-Dspark.version={version}",
            "dependency:copy-dependencies",
            f"-DoutputDirectory={cache}",
            "-DincludeScope=runtime",
        ]
        try:
            subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
        except (OSError, subprocess.CalledProcessError) as error:
            raise SparkSetupError(f"could not resolve the Kafka connector: {error}") from None
        marker.touch()
    jars = sorted(cache.glob("*.jar"))
    if not any(jar.name.startswith(CONNECTOR) for jar in jars):
        raise SparkSetupError(f"no {CONNECTOR} jar in {cache}")
    return jars


def _submitted_conf() -> dict[str, str]:
    """The conf spark-submit gave this driver: its JVM is up before the session is."""
    from pyspark import SparkConf, SparkContext

    SparkContext._ensure_initialized()
    return dict(SparkConf().getAll())


def _merged(existing: str | None, added: list[str]) -> str:
    """A comma-separated Spark list (jars, archives) with ``added`` after what was there,
    leaving out an added file whose name is there already (spark-submit gives URIs)."""
    items = [item for item in (existing or "").split(",") if item]
    names = {_file_name(item) for item in items}
    return ",".join([*items, *(item for item in added if _file_name(item) not in names)])


def _file_name(item: str) -> str:
    """The file name of a path or URI, with its ``#link`` when it has one."""
    parts = urlsplit(item)
    name = PurePosixPath(parts.path).name
    return f"{name}#{parts.fragment}" if parts.fragment else name


@contextmanager
def _python_for_workers(python: str) -> Iterator[None]:
    """``PYSPARK_PYTHON`` while the context starts: pyspark reads the executors'
    interpreter from it then, and a later session in this process chooses anew."""
    before = os.environ.get("PYSPARK_PYTHON")
    os.environ["PYSPARK_PYTHON"] = python
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("PYSPARK_PYTHON", None)
        else:
            os.environ["PYSPARK_PYTHON"] = before


#: The project's packages the executors import (the engine's batch functions, the streams
#: API, the demo pipelines and the job's tasks).
SHIPPED_PACKAGES = ("core", "tables", "streams", "agents", "jobs")


def top_level_files(modules: Iterable[str]) -> list[Path]:
    """The files that hold the pipeline modules outside the project's packages: a
    top-level package's folder, or a module's file (imported here, as the driver loads
    them)."""
    found: dict[Path, None] = {}
    for name in modules:
        top_name = name.split(".")[0]
        top = importlib.import_module(top_name)
        origin = getattr(top, "__file__", None)
        if origin is None:
            continue
        path = Path(origin).resolve()
        if path.name == "__init__.py":
            path = path.parent
        if top_name in SHIPPED_PACKAGES and path.parent == ROOT:
            continue  # one of the project's own packages
        found[path] = None
    return list(found)


def _zip_tree(archive: zipfile.ZipFile, folder: Path, base: Path) -> None:
    for module in sorted(folder.rglob("*.py")):
        if "__pycache__" not in module.parts:
            archive.write(module, module.relative_to(base).as_posix())


def ship_modules(spark: Any, modules: Iterable[str]) -> list[str]:
    """Send the pipeline modules that live outside the project to the executors
    (``addPyFile``), and on a cluster the project's packages too; returns what was added
    (a file a session has already is not added again)."""
    context = spark.sparkContext
    scratch = Path(tempfile.mkdtemp(prefix="streamstate-pyfiles-"))
    shipped: list[str] = []
    if not str(context.master).startswith("local"):
        target = scratch / "streamstate.zip"
        with zipfile.ZipFile(target, "w") as archive:
            for package in SHIPPED_PACKAGES:
                _zip_tree(archive, ROOT / package, ROOT)
        shipped.append(str(target))
    for path in top_level_files(modules):
        if path.is_dir():
            bundle = scratch / f"{path.name}.zip"
            with zipfile.ZipFile(bundle, "w") as archive:
                _zip_tree(archive, path, path.parent)
            shipped.append(str(bundle))
        else:
            shipped.append(str(path))
    known = set(getattr(context, "_python_includes", None) or ())
    added = [item for item in shipped if Path(item).name not in known]
    for item in added:
        context.addPyFile(item)
    return added


def build_session(
    master: str | None,
    shuffle_partitions: int | None = None,
    python_env: str | None = None,
    conf: Mapping[str, str] | None = None,
    modules: Iterable[str] = (),
) -> Any:
    """A SparkSession for the job; ``master`` None keeps what spark-submit chose. ``conf``
    (``--conf`` of the job) is set last: the operator's word wins over the job's defaults.

    The executors' Python is ``python_env`` when given (an interpreter every node has),
    else ``PYSPARK_PYTHON``, else the driver's own on a local master and on any other
    the driver's dependencies packed as an archive (``jobs/pyenv.py``), shipped with
    ``spark.archives`` and unpacked by each executor. ``modules``: the pipeline modules,
    whose dependencies the packed environment holds (:func:`ship_modules` sends them).
    """
    # pyspark 4.2 warns about pandas 3 whenever it looks at pandas; the job uses Arrow.
    warnings.filterwarnings(
        "ignore", message="PySpark does not yet fully support pandas", category=FutureWarning
    )
    from pyspark.sql import SparkSession

    submitted = _submitted_conf() if master is None else {}
    local = (master or submitted.get("spark.master", "local[*]")).startswith("local")
    builder = SparkSession.builder.appName("streamstate-recompute")
    if master:
        builder = builder.master(master)
    jars = job_jars(local)
    if jars:
        merged = _merged(submitted.get("spark.jars"), [str(j) for j in jars])
        builder = builder.config("spark.jars", merged)
    python = pyenv.choose_python(local, python_env, os.environ, modules)
    builder = builder.config("spark.pyspark.python", python.python).config(
        pyenv.SOURCE_KEY, python.source
    )
    if python.archive is not None:
        shipped = f"{python.archive}#{pyenv.ARCHIVE_LINK}"
        archives = _merged(submitted.get("spark.archives"), [shipped])
        builder = builder.config("spark.archives", archives)
    if master is not None and local:
        # The local JVM starts here: room for the aggregations, and the throughput
        # collector (a batch job has no pause target).
        builder = builder.config(
            "spark.driver.memory", os.environ.get("STREAMSTATE_SPARK_DRIVER_MEMORY", "2g")
        ).config("spark.driver.extraJavaOptions", "-XX:+UseParallelGC")
    partitions = shuffle_partitions or max(2, 2 * (os.cpu_count() or 1))
    builder = (
        builder.config("spark.sql.shuffle.partitions", str(partitions))
        .config("spark.sql.adaptive.enabled", "true")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.enabled", "false")
        # The job submits Spark jobs from several threads, each in its own pool
        # (jobs/recompute.py in_pool): the pools share the cores fairly.
        .config("spark.scheduler.mode", "FAIR")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config(ARROW_MAX_BYTES_KEY, str(NO_ARROW_BYTE_LIMIT))
        .config(ARROW_MAX_RECORDS_KEY, str(ARROW_MAX_RECORDS))
    )
    if SCHEDULER_POOLS.is_file():
        builder = builder.config("spark.scheduler.allocation.file", str(SCHEDULER_POOLS))
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    with _python_for_workers(python.python):
        spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def main(argv: list[str] | None = None) -> int:
    """``python -m jobs.session`` (``make spark-jars``): resolve the connector jars now."""
    try:
        if bundled_connector():
            print("spark-jars: pyspark already ships the Kafka source")
        else:
            jars = resolve_jars()
            print(f"spark-jars: {len(jars)} jars in {jars[0].parent}")
    except SparkSetupError as error:
        print(f"spark-jars: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
