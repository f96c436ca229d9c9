"""The Spark session of the batch job, with Spark's Kafka source on its classpath.

The connector (``spark-sql-kafka-0-10``, the version of the installed pyspark) is resolved
from Maven Central by ``jobs/pom.xml`` once, into ``.cache/spark-jars-<version>/``, and
passed as ``spark.jars``: Spark's own ``spark.jars.packages`` resolver does not read
Maven's settings. An image that copied the connector into pyspark's own ``jars/`` folder
needs neither.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import warnings
import zipfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
POM = Path(__file__).resolve().parent / "pom.xml"
CONNECTOR = "spark-sql-kafka-0-10"
#: Modules the executors' Python workers import (the UDFs call the shared semantics).
SHIPPED = ("app/__init__.py", "app/models.py", "app/semantics.py", "jobs/__init__.py")


class SparkSetupError(RuntimeError):
    """The Kafka connector jars could not be found or resolved."""


def spark_version() -> str:
    import pyspark

    return str(pyspark.__version__)


def bundled_connector() -> bool:
    """Whether pyspark's own jars folder already holds the Kafka source."""
    import pyspark

    jars = Path(pyspark.__file__).resolve().parent / "jars"
    return any(jars.glob(f"{CONNECTOR}_*.jar"))


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


def _ship_semantics(spark: Any) -> None:
    """On a cluster, send the pure modules the UDFs import to the executors."""
    target = Path(tempfile.mkdtemp(prefix="streamstate-pyfiles-")) / "streamstate_jobs.zip"
    with zipfile.ZipFile(target, "w") as archive:
        for name in SHIPPED:
            archive.write(ROOT / name, name)
        for module in sorted((ROOT / "jobs").glob("*.py")):
            archive.write(module, f"jobs/{module.name}")
    spark.sparkContext.addPyFile(str(target))


def build_session(master: str | None, shuffle_partitions: int | None = None) -> Any:
    """A SparkSession for the job; ``master`` None keeps what spark-submit chose."""
    # pyspark 4.2 warns about pandas 3 on every UDF; the UDFs here use plain Series.
    warnings.filterwarnings(
        "ignore", message="PySpark does not yet fully support pandas", category=FutureWarning
    )
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName("streamstate-recompute")
    if master:
        builder = builder.master(master)
    if not bundled_connector():
        builder = builder.config("spark.jars", ",".join(str(j) for j in resolve_jars()))
    if master is not None and master.startswith("local"):
        # Executors' Python workers must run the interpreter that has the project.
        builder = builder.config("spark.pyspark.python", sys.executable)
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    partitions = shuffle_partitions or max(2, 2 * (os.cpu_count() or 1))
    builder = (
        builder.config("spark.sql.shuffle.partitions", str(partitions))
        .config("spark.sql.adaptive.enabled", "true")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
    )
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    if not str(spark.sparkContext.master).startswith("local"):
        _ship_semantics(spark)
    return spark


def main() -> int:
    """``python -m jobs.session``: resolve the connector jars now (``make spark-jars``)."""
    if bundled_connector():
        print("spark-jars: pyspark already ships the Kafka source")
        return 0
    try:
        jars = resolve_jars()
    except SparkSetupError as error:
        print(f"spark-jars: {error}", file=sys.stderr)
        return 1
    print(f"spark-jars: {len(jars)} jars in {jars[0].parent}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
