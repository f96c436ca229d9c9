"""The executors' Python environment: what is packed, how it runs, which one is chosen."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from jobs import pyenv
from jobs.session import _merged, job_jars
from jobs.standalone import node_env


def names(dists: list[pyenv.metadata.Distribution]) -> set[str]:
    return {pyenv.canonical(d.metadata["Name"]) for d in dists}


def test_the_packed_distributions_are_what_the_replay_and_the_pipelines_import() -> None:
    modules = ["agents.words", "agents.inventory", "agents.sales", "agents.settling"]
    packed = names(pyenv.closure(pyenv.executor_distributions(modules)))
    assert {"pyarrow", "pydantic", "pydantic-core", "orjson", "sortedcontainers"} <= packed
    # Neither Spark (the cluster has it), nor the project (shipped as modules), nor the
    # worker's server and faust, nor the driver's other tools.
    unused = {"pyspark", "py4j", "streamstate", "faust-streaming", "fastapi", "pandas", "pytest"}
    assert not packed & unused


def test_a_pipeline_modules_own_imports_are_packed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "user_pipeline.py").write_text(
        "import yaml\n\ndef pipelines(context):\n    return []\n"
    )
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    assert "PyYAML" in pyenv.executor_distributions(["user_pipeline"])
    with pytest.raises(pyenv.PackError, match="no_such_pipeline_module"):
        pyenv.executor_distributions(["no_such_pipeline_module"])


def test_extras_are_not_followed() -> None:
    # pandas' extras name pytest, matplotlib, sqlalchemy...: none is a requirement.
    allowed = {"pandas", "numpy", "python-dateutil", "six", "tzdata"}
    assert names(pyenv.closure(["pandas"])) <= allowed


def test_a_missing_root_distribution_is_an_error() -> None:
    with pytest.raises(pyenv.PackError, match="not-a-distribution-here is not installed"):
        pyenv.closure(["not-a-distribution-here"])


def test_the_archive_name_changes_with_any_version() -> None:
    dists = pyenv.closure(["pydantic"])
    name = pyenv.archive_name(dists)
    assert name == pyenv.archive_name(pyenv.closure(["pydantic"]))
    major, minor = sys.version_info[:2]
    assert name.startswith(f"streamstate-executor-env-py{major}{minor}-")
    assert name != pyenv.archive_name(dists[:-1])


def test_an_unpacked_archive_is_a_virtualenv_with_only_the_packed_distributions(
    tmp_path: Path,
) -> None:
    archive = pyenv.write_archive(tmp_path / "env.tar.gz", pyenv.closure(["typing-extensions"]))
    with tarfile.open(archive) as packed:
        packed.extractall(tmp_path / "env", filter="fully_trusted")
    python = tmp_path / "env" / "bin" / "python"
    probe = "import sys, typing_extensions; print(sys.prefix)"
    clean = {"PATH": "/usr/bin:/bin"}
    done = subprocess.run([str(python), "-c", probe], env=clean, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()) == tmp_path / "env"
    isolated = subprocess.run(
        [str(python), "-c", "import pydantic"], env=clean, capture_output=True, text=True
    )
    assert "No module named 'pydantic'" in isolated.stderr
    assert oct(archive.stat().st_mode & 0o777) == "0o644"


def test_the_executors_python_is_chosen_option_first_then_environment_then_archive(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(pyenv, "executor_archive", lambda **_: tmp_path / "env.tar.gz")
    env = {"PYSPARK_PYTHON": "/opt/py/bin/python"}
    chosen = pyenv.choose_python(False, "/usr/bin/python3.11", env)
    assert (chosen.python, chosen.source, chosen.archive) == (
        "/usr/bin/python3.11",
        pyenv.SOURCE_OPTION,
        None,
    )
    assert pyenv.choose_python(False, None, env).source == pyenv.SOURCE_ENV
    shipped = pyenv.choose_python(False, None, {})
    assert (shipped.python, shipped.archive) == (pyenv.ARCHIVE_PYTHON, tmp_path / "env.tar.gz")
    local = pyenv.choose_python(True, None, {})
    assert (local.python, local.source, local.archive) == (sys.executable, "driver", None)


def test_the_cache_is_the_environments_choice_then_a_writable_checkout(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("STREAMSTATE_CACHE_DIR", str(tmp_path))
    assert pyenv.cache_dir() == tmp_path
    monkeypatch.delenv("STREAMSTATE_CACHE_DIR")
    assert pyenv.cache_dir() == Path(pyenv.__file__).resolve().parents[1] / ".cache"


def test_spark_lists_keep_what_spark_submit_gave() -> None:
    given = "file:/opt/jars/kafka-clients-3.9.2.jar,local:/x/udfs.jar"
    merged = _merged(given, ["/cache/kafka-clients-3.9.2.jar", "/cache/commons-pool2-2.jar"])
    assert merged == f"{given},/cache/commons-pool2-2.jar"
    assert _merged(None, ["/c/env.tar.gz#streamstate-env"]) == "/c/env.tar.gz#streamstate-env"


def test_a_cluster_is_sent_the_connector_a_local_master_loads_from_the_classpath(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from jobs import session

    (tmp_path / "spark-sql-kafka-0-10_2.13-4.2.0.jar").touch()
    (tmp_path / "kafka-clients-3.9.2.jar").touch()
    (tmp_path / "commons-pool-1.5.4.jar").touch()  # Spark's own, not the connector's
    monkeypatch.setattr(session, "pyspark_jars", lambda: tmp_path)
    assert job_jars(local=True) == []
    assert [j.name for j in job_jars(local=False)] == [
        "kafka-clients-3.9.2.jar",
        "spark-sql-kafka-0-10_2.13-4.2.0.jar",
    ]


def test_the_pipeline_modules_outside_the_project_are_shipped_the_projects_are_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from jobs import session

    package = tmp_path / "acme_pipelines"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "views.py").write_text("def pipelines(context):\n    return []\n")
    (tmp_path / "single_pipeline.py").write_text("def pipelines(context):\n    return []\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    found = session.top_level_files(["acme_pipelines.views", "single_pipeline", "agents.words"])
    assert found == [package.resolve(), (tmp_path / "single_pipeline.py").resolve()]


def test_a_standalone_worker_has_no_trace_of_the_drivers_python() -> None:
    venv_bin = str(Path(sys.prefix) / "bin")
    base = {
        "PATH": os.pathsep.join([venv_bin, "/usr/bin"]),
        "PYSPARK_PYTHON": sys.executable,
        "VIRTUAL_ENV": sys.prefix,
        "HOME": "/root",
    }
    env = node_env(base)
    assert env["PATH"] == "/usr/bin"
    assert "PYSPARK_PYTHON" not in env
    assert "VIRTUAL_ENV" not in env
    assert (env["HOME"], env["SPARK_LOCAL_IP"]) == ("/root", "127.0.0.1")
