"""The preflight's verdicts: one line naming the missing piece and the fix, from what the
executors answered or from the error Spark raised for them (texts as Spark 4.2 words them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobs import preflight
from jobs.preflight import PreflightError, Probe
from jobs.pyenv import ARCHIVE_PYTHON, SOURCE_ARCHIVE, SOURCE_ENV, SOURCE_OPTION
from jobs.recompute import parse_args

CANNOT_RUN = """py4j.protocol.Py4JJavaError: An error occurred while calling collectAndServe.
: org.apache.spark.SparkException: Job aborted due to stage failure: Task 1 in stage 0.0
failed 4 times, most recent failure: Lost task 1.3 in stage 0.0 (TID 4) (127.0.0.1 executor 1):
java.io.IOException: Cannot run program "/opt/nope/python": error=2, No such file or directory
\tat java.base/java.lang.ProcessBuilder.start(ProcessBuilder.java:1143)"""

VERSION_MISMATCH = """pyspark.errors.exceptions.captured.PythonException:
  An exception was thrown from the Python worker. Please see the stack trace below.
Traceback (most recent call last):
pyspark.errors.exceptions.base.PySparkRuntimeError: [PYTHON_VERSION_MISMATCH] Python in worker
has different version: 3.10 than that in driver: 3.11, PySpark cannot run with different minor
versions."""


def probe(*missing: tuple[str, str | None]) -> Probe:
    failures = {
        module: (name, f"ModuleNotFoundError: No module named {name!r}") for module, name in missing
    }
    return Probe("/work/app-1/0/streamstate-env/bin/python", "3.11.7", failures)


def test_executors_that_import_everything_pass() -> None:
    preflight.judge_probes([probe(), probe()], SOURCE_ARCHIVE, ARCHIVE_PYTHON)


def test_a_missing_module_is_named_with_the_interpreter_and_the_fix() -> None:
    answers = [probe(), probe(("pyarrow", "pyarrow"), ("jobs.tasks", "pyarrow"))]
    with pytest.raises(PreflightError) as raised:
        preflight.judge_probes(answers, SOURCE_OPTION, "/usr/bin/python3")
    message = str(raised.value)
    assert "\n" not in message
    assert "(/usr/bin/python3 from --python-env;" in message
    assert "cannot import pyarrow (ModuleNotFoundError: No module named 'pyarrow')" in message
    assert message.endswith(
        "fix: install what provides pyarrow for /usr/bin/python3 on every node, "
        "or leave out --python-env so that the job ships its own environment"
    )


def test_a_pipeline_module_the_executors_cannot_import_is_named() -> None:
    answers = [probe(("mycompany.pipelines", "mycompany"))]
    with pytest.raises(PreflightError) as raised:
        preflight.judge_probes(answers, SOURCE_ARCHIVE, ARCHIVE_PYTHON)
    assert "cannot import mycompany (ModuleNotFoundError" in str(raised.value)
    assert "install what provides mycompany in the driver's environment" in str(raised.value)


def test_a_module_whose_own_import_fails_names_what_it_lacked() -> None:
    answers = [probe(("jobs.tasks", "pydantic"), ("pyarrow", "pyarrow"))]
    with pytest.raises(PreflightError, match="cannot import pyarrow, pydantic"):
        preflight.judge_probes(answers, SOURCE_ENV, "python3")


def test_an_interpreter_that_cannot_start_is_named() -> None:
    error = preflight.explain_python_failure(
        RuntimeError(CANNOT_RUN), SOURCE_OPTION, "/opt/nope/python"
    )
    assert str(error) == (
        "the executors cannot start Python '/opt/nope/python' (/opt/nope/python from "
        "--python-env: No such file or directory); fix: install it on every node or name one "
        "they have with --python-env"
    )


def test_a_packed_environment_whose_interpreter_the_nodes_lack_says_so() -> None:
    text = CANNOT_RUN.replace("/opt/nope/python", ARCHIVE_PYTHON)
    error = preflight.explain_python_failure(RuntimeError(text), SOURCE_ARCHIVE, ARCHIVE_PYTHON)
    assert "cannot start the packed environment's Python" in str(error)
    assert "needs at the same path" in str(error)


def test_another_python_version_on_the_executors_is_named() -> None:
    error = preflight.explain_python_failure(RuntimeError(VERSION_MISMATCH), SOURCE_ENV, "python3")
    assert "is 3.10 and the driver's 3.11" in str(error)
    assert "\n" not in str(error)


def test_the_probe_reports_imports_without_raising() -> None:
    task = preflight._import_probe(("json", "no_such_module_here"))
    [(executable, version, failures)] = list(task(iter([0])))
    assert executable
    assert version.count(".") == 2
    assert list(failures) == ["no_such_module_here"]
    assert failures["no_such_module_here"][0] == "no_such_module_here"


def test_preflight_only_needs_no_output_directory() -> None:
    options = parse_args(["--preflight-only", "--master", "spark://m:7077", "--python-env", "py"])
    assert options.preflight_only
    assert (options.master, options.python_env) == ("spark://m:7077", "py")
    with pytest.raises(SystemExit):
        parse_args(["--master", "spark://m:7077"])


def test_the_views_go_under_the_output_directory_unless_placed_elsewhere() -> None:
    assert parse_args(["--out", "x"]).views_at == Path("x")
    shared = parse_args(["--out", "x", "--views", "hdfs://nn:8020/streamstate/run"])
    assert shared.views_at == "hdfs://nn:8020/streamstate/run"
    assert shared.out == Path("x")


def test_spark_settings_are_taken_as_spark_submit_takes_them() -> None:
    options = parse_args(["--out", "x", "--conf", "spark.executor.memory=2g", "--conf", "a.b=c=d"])
    assert options.spark_conf == (("spark.executor.memory", "2g"), ("a.b", "c=d"))
    with pytest.raises(SystemExit):
        parse_args(["--out", "x", "--conf", "no-value"])
