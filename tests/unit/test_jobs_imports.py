"""The nightly job never imports faust: it runs where no worker does (a Spark driver, a
cluster's executors), with the pipelines loaded as the workers load them."""

from __future__ import annotations

import subprocess
import sys

from tests.support.kafka import ROOT

JOB_MODULES = (
    "jobs.recompute",
    "jobs.tasks",
    "jobs.replay",
    "jobs.plans",
    "jobs.declared",
    "jobs.stages",
    "jobs.live",
    "jobs.compare",
    "jobs.rows",
    "jobs.globals",
    "jobs.corrections",
    "jobs.session",
    "jobs.preflight",
    "jobs.pyenv",
    "jobs.standalone",
)
PIPELINE_MODULES = ("agents.words", "agents.inventory", "agents.sales", "agents.settling")

PROBE = """
import importlib, json, sys
from jobs.declared import JobSpec, declare
for name in sys.argv[1:]:
    importlib.import_module(name)
declare(JobSpec(tuple(sys.argv[-4:]), 8, 1024, 1, "streamstate", 0))
print(json.dumps(sorted(m for m in sys.modules if m == "faust" or m.startswith("faust."))))
"""


def test_the_jobs_modules_and_the_pipelines_they_load_never_import_faust() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *JOB_MODULES, *PIPELINE_MODULES],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


def test_the_probe_would_see_faust_imported() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, "faust", *PIPELINE_MODULES],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "faust" in done.stdout
