"""The Spark session of the batch job, with Spark's Kafka source and the job's own Java
UDFs on its classpath.

The connector (``spark-sql-kafka-0-10``, the version of the installed pyspark) is resolved
from Maven Central by ``jobs/pom.xml`` once, into ``.cache/spark-jars-<version>/``, and
passed as ``spark.jars``: Spark's own ``spark.jars.packages`` resolver does not read
Maven's settings. An image that copied the connector into pyspark's own ``jars/`` folder
needs neither.

The Java code (``jobs/java/``: the parsers of item events and catalogue records in the
plain form, the store totals, the tokeniser and the word counter, with the Python
character tables of ``jobs/pytext.py``) is compiled with
``javac`` against pyspark's jars into
``.cache/streamstate-udfs-<version>-<hash>.jar`` on first use, or installed into pyspark's
``jars/`` folder (``python -m jobs.session --install-udfs``, as the batch image does).
Without a JDK the job still runs, slower: every item event and catalogue record is then
parsed in Python, ASCII lines are split by Spark SQL functions and the others by Python.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import warnings
import zipfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

from jobs import pyenv, pytext

ROOT = Path(__file__).resolve().parents[1]
POM = Path(__file__).resolve().parent / "pom.xml"
CONNECTOR = "spark-sql-kafka-0-10"
JAVA_SOURCES = Path(__file__).resolve().parent / "java"
#: The job's scheduler pools (one per thread that submits Spark jobs).
SCHEDULER_POOLS = Path(__file__).resolve().parent / "fairscheduler.xml"
#: The Java UDFs: SQL name -> (class, return type).
JAVA_UDFS = {
    "streamstate_plain_item_event": (
        "streamstate.jobs.PlainItemEvent",
        "struct<ok:boolean,event_id:string,store_id:string,sku:string,kind:string,"
        "quantity:bigint,unit_price:double,ts:bigint>",
    ),
    "streamstate_plain_product": (
        "streamstate.jobs.PlainProduct",
        "struct<ok:boolean,category:string>",
    ),
    "streamstate_words": ("streamstate.jobs.Words", "array<string>"),
}
UDF_JAR_PREFIX = "streamstate-udfs"
#: Python's character tables in the jar, next to the class that reads them.
TEXT_TABLES = "streamstate/jobs/python-text.bin"
#: Modules the executors' Python workers import (the UDFs call the shared semantics).
SHIPPED = ("core/__init__.py", "core/models.py", "core/semantics.py", "jobs/__init__.py")


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


def job_jars(local: bool) -> tuple[list[Path], Path | None]:
    """The jars the session ships (``spark.jars``) and the UDF jar (None without a JDK).

    A local master loads what pyspark's jars folder holds by itself; a cluster's
    executors are sent everything the job needs from outside their Spark."""
    bundled = bundled_connector()
    jars = [] if bundled and local else bundled_connector_jars() if bundled else resolve_jars()
    udfs = udf_jar()
    if udfs is not None and (udfs.parent != pyspark_jars() or not local):
        jars.append(udfs)
    return jars, udfs


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


def _udf_sources() -> list[Path]:
    return sorted(JAVA_SOURCES.rglob("*.java"))


def udf_jar_name() -> str:
    """Named by the Spark version, the sources and the Python the text tables come from."""
    digest = hashlib.sha256(pytext.fingerprint().encode())
    for source in [*_udf_sources(), Path(pytext.__file__).resolve()]:
        digest.update(source.relative_to(ROOT).as_posix().encode())
        digest.update(source.read_bytes())
    return f"{UDF_JAR_PREFIX}-{spark_version()}-{digest.hexdigest()[:12]}.jar"


def bundled_udfs() -> Path | None:
    """The UDF jar in pyspark's own jars folder, if this version of it is installed there."""
    jar = pyspark_jars() / udf_jar_name()
    return jar if jar.exists() else None


def build_udf_jar(target: Path) -> Path:
    """Compile ``jobs/java`` against pyspark's jars into the jar ``target``."""
    javac = shutil.which("javac")
    if javac is None:
        raise SparkSetupError("javac not found: the Java UDFs need a JDK to be built")
    classpath = os.pathsep.join(str(j) for j in sorted(pyspark_jars().glob("*.jar")))
    with tempfile.TemporaryDirectory(prefix="streamstate-udfs-") as scratch:
        classes = Path(scratch) / "classes"
        command = [javac, "--release", "17", "-nowarn", "-cp", classpath, "-d", str(classes)]
        done = subprocess.run(
            command + [str(s) for s in _udf_sources()], capture_output=True, text=True
        )
        if done.returncode != 0:
            raise SparkSetupError(f"javac failed: {done.stderr.strip()[-2000:]}")
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_suffix(f".{os.getpid()}.tmp")  # another job may build it too
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as archive:
            archive.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\r\n\r\n")
            for path in sorted(classes.rglob("*.class")):
                archive.write(path, path.relative_to(classes).as_posix())
            archive.writestr(TEXT_TABLES, pytext.tables())
        partial.replace(target)
    return target


def udf_jar() -> Path | None:
    """The jar of the Java UDFs: installed, cached, or built now; None without a JDK."""
    installed = bundled_udfs()
    if installed is not None:
        return installed
    cached = ROOT / ".cache" / udf_jar_name()
    if cached.exists():
        return cached
    try:
        print("recompute: compiling the Java UDFs", file=sys.stderr)
        return build_udf_jar(cached)
    except SparkSetupError as error:
        print(f"recompute: {error}; item events will be parsed in Python", file=sys.stderr)
        return None


def register_udfs(spark: Any) -> bool:
    """Register the Java UDFs on ``spark``; False when their classes are not loadable."""
    try:
        for name, (cls, return_type) in JAVA_UDFS.items():
            spark.udf.registerJavaFunction(name, cls, return_type)
    except Exception as error:  # py4j reports a missing class as a generic error
        print(
            f"recompute: Java UDFs unavailable ({type(error).__name__}); "
            "item events will be parsed in Python",
            file=sys.stderr,
        )
        return False
    return True


def _ship_semantics(spark: Any) -> None:
    """On a cluster, send the pure modules the UDFs import to the executors."""
    target = Path(tempfile.mkdtemp(prefix="streamstate-pyfiles-")) / "streamstate_jobs.zip"
    with zipfile.ZipFile(target, "w") as archive:
        for name in SHIPPED:
            archive.write(ROOT / name, name)
        for module in sorted((ROOT / "jobs").glob("*.py")):
            if f"jobs/{module.name}" not in SHIPPED:
                archive.write(module, f"jobs/{module.name}")
    spark.sparkContext.addPyFile(str(target))


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


def build_session(
    master: str | None,
    shuffle_partitions: int | None = None,
    python_env: str | None = None,
    conf: Mapping[str, str] | None = None,
) -> Any:
    """A SparkSession for the job; ``master`` None keeps what spark-submit chose. ``conf``
    (``--conf`` of the job) is set last: the operator's word wins over the job's defaults.

    The executors' Python is ``python_env`` when given (an interpreter every node has),
    else ``PYSPARK_PYTHON``, else the driver's own on a local master and on any other
    the driver's dependencies packed as an archive (``jobs/pyenv.py``), shipped with
    ``spark.archives`` and unpacked by each executor.
    """
    # pyspark 4.2 warns about pandas 3 on every UDF; the UDFs here use plain Series.
    warnings.filterwarnings(
        "ignore", message="PySpark does not yet fully support pandas", category=FutureWarning
    )
    from pyspark.sql import SparkSession

    submitted = _submitted_conf() if master is None else {}
    local = (master or submitted.get("spark.master", "local[*]")).startswith("local")
    builder = SparkSession.builder.appName("streamstate-recompute")
    if master:
        builder = builder.master(master)
    jars, udfs = job_jars(local)
    if jars:
        merged = _merged(submitted.get("spark.jars"), [str(j) for j in jars])
        builder = builder.config("spark.jars", merged)
    python = pyenv.choose_python(local, python_env, os.environ)
    builder = builder.config("spark.pyspark.python", python.python).config(
        pyenv.SOURCE_KEY, python.source
    )
    if python.archive is not None:
        shipped = f"{python.archive}#{pyenv.ARCHIVE_LINK}"
        archives = _merged(submitted.get("spark.archives"), [shipped])
        builder = builder.config("spark.archives", archives)
    if master is not None and local:
        # The local JVM starts here: room for the aggregations, and the throughput
        # collector (a batch job has no pause target; measured: about 3 s of 50 s).
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
    )
    if SCHEDULER_POOLS.is_file():
        builder = builder.config("spark.scheduler.allocation.file", str(SCHEDULER_POOLS))
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    with _python_for_workers(python.python):
        spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    if not str(spark.sparkContext.master).startswith("local"):
        _ship_semantics(spark)
    if udfs is not None and str(udfs) not in spark.sparkContext.getConf().get("spark.jars", ""):
        # Under spark-submit the session existed before: spark.jars set here came too late.
        spark.sql(f"ADD JAR '{udfs}'")
    register_udfs(spark)
    return spark


def udf_jar_in_use(spark: Any) -> str | None:
    """The UDF jar the session loads (from spark.jars or pyspark's jars folder), if any."""
    shipped = spark.sparkContext.getConf().get("spark.jars", "")
    for jar in shipped.split(","):
        if Path(jar).name.startswith(UDF_JAR_PREFIX):
            return str(jar)
    installed = bundled_udfs()
    return None if installed is None else str(installed)


def main(argv: list[str] | None = None) -> int:
    """``python -m jobs.session``: resolve the connector jars and build the UDF jar now
    (``make spark-jars``); ``--install-udfs`` puts the UDF jar into pyspark's jars folder."""
    args = sys.argv[1:] if argv is None else argv
    try:
        if args == ["--install-udfs"]:
            target = build_udf_jar(pyspark_jars() / udf_jar_name())
            print(f"spark-jars: Java UDFs installed as {target}")
            return 0
        if bundled_connector():
            print("spark-jars: pyspark already ships the Kafka source")
        else:
            jars = resolve_jars()
            print(f"spark-jars: {len(jars)} jars in {jars[0].parent}")
        udfs = udf_jar()
    except SparkSetupError as error:
        print(f"spark-jars: {error}", file=sys.stderr)
        return 1
    if udfs is None:
        return 1
    print(f"spark-jars: Java UDFs in {udfs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
