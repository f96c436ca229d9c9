"""The pipelines the job recomputes, loaded as the workers load them.

The driver and every executor load the same pipeline modules (the ``STREAMSTATE_PIPELINES``
and ``STREAMSTATE_EXTRA_PIPELINES`` settings) through ``streams.loading.load`` with the
same :class:`Context`, except for its clock, which is the time of the job's offset cut:
windows expire as of the cut, on both sides of the comparison. Global tables are built
by the driver from their topics up to the cut and broadcast; an executor loads the
pipelines once per Python worker process and keeps them for every task it runs.
"""

from __future__ import annotations

import gc
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from jobs.plans import JobPlan, plan_job
from jobs.replay import ReplayGlobal
from streams.loading import Loaded, load
from tables.global_table import Versions
from tables.pipeline import Context

#: Global tables' data: name -> key -> versions (``tables.global_table.Versions``).
GlobalData = Mapping[str, Mapping[str, Versions]]


@dataclass(frozen=True)
class JobSpec:
    """Everything an executor needs to load the pipelines as the driver did."""

    modules: tuple[str, ...]
    partitions: int
    max_event_bytes: int
    window_retention_ms: int
    app_id: str
    #: the cut's time, in ms: the pipelines' clock
    clock_ms: int
    #: the executors' garbage collector thresholds, as the workers' (``gc.set_threshold``):
    #: a replay allocates millions of short-lived objects and keeps many (measured on the
    #: bench's item events: 13.7 against 9.8 us of CPU per event with CPython's defaults)
    gc_thresholds: tuple[int, int, int] = (100_000, 50, 100)

    def context(self, global_tables: Mapping[str, Any]) -> Context:
        seconds = self.clock_ms / 1000
        return Context(
            partitions=self.partitions,
            max_event_bytes=self.max_event_bytes,
            window_retention_ms=self.window_retention_ms,
            app_id=self.app_id,
            clock=lambda: seconds,
            global_tables=global_tables,
        )


@dataclass
class Declared:
    """The loaded pipelines, what the job makes of them, and their global tables."""

    spec: JobSpec
    loaded: Loaded
    plan: JobPlan
    globals: dict[str, ReplayGlobal]


def declare(spec: JobSpec, global_data: GlobalData | None = None) -> Declared:
    """Load the pipeline modules with the job's context. ``global_data``: the global
    tables' contents (None: empty, as the driver has them before it reads them)."""
    tables: dict[str, ReplayGlobal] = {}
    loaded = load(spec.modules, spec.context(tables))
    for name, global_spec in loaded.globals.items():
        data = {} if global_data is None else dict(global_data.get(name, {}))
        tables[name] = ReplayGlobal(global_spec, data)
    return Declared(spec, loaded, plan_job(loaded), tables)


_LOADED: dict[tuple[JobSpec, int], Declared] = {}


def on_executor(spec: JobSpec, global_data: Any) -> Declared:
    """The pipelines as an executor runs them: loaded once per Python worker process,
    spec and broadcast of the global tables (a broadcast's object lives as long as the
    process; plain data is loaded each time)."""
    gc.set_threshold(*spec.gc_thresholds)
    if isinstance(global_data, Mapping):
        return declare(spec, global_data)
    key = (spec, id(global_data))
    found = _LOADED.get(key)
    if found is None:
        found = _LOADED[key] = declare(spec, global_data.value)
    return found
