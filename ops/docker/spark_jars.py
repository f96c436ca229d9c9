"""Add Spark's Kafka connector jars to pyspark's own jars folder, skipping every artifact
that pyspark already ships.

Maven resolves the connector with its transitive dependencies, some of which pyspark
bundles at other versions (scala-library, slf4j-api, snappy-java, ...); a second version
of those on one classpath breaks Spark. Only the artifacts pyspark lacks are copied.

    python ops/docker/spark_jars.py RESOLVED_DIR [PYSPARK_JARS_DIR]
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
from pathlib import Path

_VERSIONED = re.compile(r"^(?P<artifact>.+?)-(?P<version>\d[^-]*(?:-[A-Za-z][\w.]*)?)\.jar$")


def artifact_name(jar: str) -> str:
    """``kafka-clients-3.9.2.jar`` -> ``kafka-clients``; unversioned names stay whole."""
    match = _VERSIONED.match(jar)
    return match.group("artifact") if match else jar.removesuffix(".jar")


def add_missing(resolved: Path, jars: Path) -> tuple[list[str], list[str]]:
    """Copy the jars of ``resolved`` whose artifact ``jars`` lacks; return (added, skipped)."""
    present = {artifact_name(jar.name) for jar in jars.glob("*.jar")}
    added: list[str] = []
    skipped: list[str] = []
    for jar in sorted(resolved.glob("*.jar")):
        if artifact_name(jar.name) in present:
            skipped.append(jar.name)
        else:
            shutil.copy2(jar, jars / jar.name)
            added.append(jar.name)
    return added, skipped


def pyspark_jars() -> Path:
    """The jars folder of the installed pyspark."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent / "jars"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("resolved", type=Path)
    parser.add_argument("jars", type=Path, nargs="?", default=None)
    args = parser.parse_args(argv)
    jars = args.jars or pyspark_jars()
    added, skipped = add_missing(args.resolved, jars)
    if not added:
        print(f"spark_jars: nothing to add from {args.resolved}", file=sys.stderr)
        return 1
    print(f"spark_jars: added {', '.join(added)}; pyspark already has {len(skipped)} others")
    return 0


if __name__ == "__main__":
    sys.exit(main())
