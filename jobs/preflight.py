"""The preflight: before the job reads Kafka, one small task on each executor core imports
what the replay needs (pyarrow, the job's tasks and every pipeline module), so that a
cluster without the job's Python environment or a pipeline module ends the run at once
with one line that names the missing piece and the fix, instead of an executor's stack
trace minutes later.

A local master runs its executors with the driver's interpreter, which has imported all
of this already: the preflight runs for the other masters.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from jobs.pyenv import (
    ARCHIVE_PYTHON,
    EXECUTOR_MODULES,
    SOURCE_ARCHIVE,
    SOURCE_DRIVER,
    SOURCE_ENV,
    SOURCE_KEY,
    SOURCE_OPTION,
)


class PreflightError(RuntimeError):
    """What the executors lack, and the fix, in one line."""


@dataclass(frozen=True)
class Probe:
    """One executor's answer: its interpreter and the modules it could not import."""

    executable: str
    version: str
    failures: dict[str, tuple[str | None, str]]  # module -> (missing module name, error)


def _import_probe(modules: tuple[str, ...]) -> Callable[[Iterable[Any]], Iterator[Any]]:
    """The task function. Nested, so that it is pickled by value: the executors need
    nothing of the project's to run it, and it only uses the standard library."""

    def probe(_rows: Iterable[Any]) -> Iterator[Any]:
        import importlib
        import sys

        failures = {}
        for module in modules:
            try:
                importlib.import_module(module)
            except Exception as error:  # an import can fail in any way
                missing = error.name if isinstance(error, ImportError) else None
                failures[module] = (missing, f"{type(error).__name__}: {error}")
        yield (sys.executable, ".".join(map(str, sys.version_info[:3])), failures)

    return probe


def probe_python(spark: Any, tasks: int, modules: Iterable[str] = ()) -> list[Probe]:
    """Run the import probe as ``tasks`` tasks (the executors' cores, at least 2): the
    job's modules and the pipeline ``modules``."""
    rdd = spark.sparkContext.parallelize(range(tasks), tasks)
    probe = _import_probe((*EXECUTOR_MODULES, *modules))
    return [Probe(*row) for row in rdd.mapPartitions(probe).collect()]


def _fix(source: str, python: str, missing: str) -> str:
    install = f"install what provides {missing}"
    if source == SOURCE_ARCHIVE:
        return (
            f"{install} in the driver's environment and run again (the archive is packed "
            "again), or pass --python-env with an interpreter the executors have"
        )
    if source == SOURCE_OPTION:
        return (
            f"{install} for {python} on every node, or leave out --python-env so that "
            "the job ships its own environment"
        )
    if source == SOURCE_ENV:
        return (
            f"{install} for {python} on every node, or unset PYSPARK_PYTHON so that "
            "the job ships its own environment"
        )
    return f"{install} in the driver's environment"


def _origin(source: str, python: str) -> str:
    if source == SOURCE_ARCHIVE:
        return f"{python}, the job's {source}"
    return f"{python} from {source}"


def judge_probes(probes: list[Probe], source: str, python: str) -> None:
    """Raise a :class:`PreflightError` naming what any executor could not import."""
    failed = [p for p in probes if p.failures]
    if not failed:
        return
    first = failed[0]
    missing = sorted({name or module for module, (name, _) in first.failures.items()})
    detail = next(iter(first.failures.values()))[1]
    raise PreflightError(
        f"the executors' Python ({_origin(source, python)}; {first.executable}, "
        f"Python {first.version}) cannot import {', '.join(missing)} ({detail}); "
        f"fix: {_fix(source, python, ', '.join(missing))}"
    )


_VERSION = re.compile(r"different version:? (\S+) than that in driver:? (\S+?),")
_CANNOT_RUN = re.compile(r'Cannot run program "([^"]*)"[^\n]*?error=\d+, ([^\n)]*)')


def explain_python_failure(error: BaseException, source: str, python: str) -> PreflightError:
    """The one line for a probe that failed before it ran: the interpreter could not be
    started, is another Python version than the driver's, or is no Python for pyspark."""
    text = str(error)
    cannot_run = _CANNOT_RUN.search(text)
    if cannot_run:
        why = cannot_run.group(2).strip()
        if source == SOURCE_ARCHIVE:
            return PreflightError(
                f"the executors cannot start the packed environment's Python "
                f"({ARCHIVE_PYTHON}: {why}): it links to the driver's base interpreter, which "
                "each node needs at the same path; fix: install that Python there, or pass "
                "--python-env with an interpreter the executors have"
            )
        return PreflightError(
            f"the executors cannot start Python {cannot_run.group(1)!r} "
            f"({_origin(source, python)}: {why}); fix: install it on every node or name one "
            "they have with --python-env"
        )
    version = _VERSION.search(text)
    if version:
        return PreflightError(
            f"the executors' Python ({_origin(source, python)}) is {version.group(1)} and the "
            f"driver's {version.group(2)}; fix: give the executors a Python "
            f"{version.group(2)} (--python-env) or run the driver with theirs"
        )
    summary = _last_line(text)
    return PreflightError(
        f"the executors could not run a Python task with {_origin(source, python)} ({summary}); "
        f"fix: check that it is a Python the driver's pyspark runs with, or pass --python-env"
    )


def _last_line(text: str) -> str:
    """The most telling line of a JVM error: the last 'Caused by', else the first line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    causes = [line for line in lines if line.startswith("Caused by:")]
    chosen = causes[-1].removeprefix("Caused by:").strip() if causes else (lines or [""])[0]
    return chosen[:300]


def run(spark: Any, modules: Iterable[str], say: Callable[[str], None]) -> None:
    """The preflight (``modules``: the pipeline modules); raises :class:`PreflightError`.
    Spark's log is off while it runs and stays off after a failure (the job ends): a
    failed task's stack traces are log lines, some written after the job was aborted,
    and the one line of the error replaces them."""
    context = spark.sparkContext
    source = context.getConf().get(SOURCE_KEY, SOURCE_DRIVER)
    python = context.pythonExec
    tasks = max(2, context.defaultParallelism)
    context.setLogLevel("OFF")
    try:
        probes = probe_python(spark, tasks, modules)
    except Exception as error:  # Py4JJavaError: the task failed before the probe ran
        raise explain_python_failure(error, source, python) from None
    judge_probes(probes, source, python)
    context.setLogLevel("WARN")
    versions = sorted({p.version for p in probes})
    say(
        f"preflight: {len(probes)} executor tasks imported the job's modules and the "
        f"pipeline modules with {python} ({source}, Python {', '.join(versions)})"
    )
