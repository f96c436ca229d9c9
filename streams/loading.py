"""Loading pipeline modules: each module's ``pipelines(context)``, compiled.

A pipeline module is any importable module with a ``pipelines(context)`` function that
returns a :class:`~streams.topology.Topology`, a ``tables.pipeline.Pipeline``, or a list
of them. The worker and the nightly job load the same modules (``STREAMSTATE_PIPELINES``
and ``STREAMSTATE_EXTRA_PIPELINES``), so they run and recompute the same pipelines.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from streams.compile import compile_all
from streams.topology import GlobalTable, Topology
from tables.global_table import GlobalSpec
from tables.pipeline import Context, Pipeline, SourceSpec, TableSpec


class PipelineModuleError(ValueError):
    """A pipeline module cannot be loaded or declares something inconsistent."""


@dataclass(frozen=True)
class Loaded:
    """What the pipeline modules declare, compiled."""

    pipelines: list[Pipeline]
    #: every table the pipelines write, by name (the first declaration of each)
    tables: dict[str, TableSpec]
    #: every source topic with a declared type, by topic
    sources: dict[str, SourceSpec]
    #: every global table, by name
    globals: dict[str, GlobalSpec]

    @property
    def topics(self) -> frozenset[str]:
        """Every topic the pipelines read."""
        return frozenset(topic for p in self.pipelines for topic in p.reads)

    @property
    def internal(self) -> frozenset[str]:
        """The topics pipelines both write and read: repartition topics."""
        produced = {topic for p in self.pipelines for topic in p.produces}
        return self.topics & produced

    @property
    def inputs(self) -> frozenset[str]:
        """The topics the pipelines read that no pipeline writes: where records come
        in (what the produce endpoint accepts), global tables' topics included."""
        found = self.topics - self.internal
        return found | {spec.topic for spec in self.globals.values()}


def flatten(result: Any) -> list[Any]:
    """What a ``pipelines(context)`` returned, as a list."""
    if isinstance(result, Topology | Pipeline):
        return [result]
    try:
        return list(result)
    except TypeError:
        raise PipelineModuleError(
            f"pipelines(context) returned {result!r}: a Topology, a Pipeline or a list"
        ) from None


def declared_by(name: str, context: Context) -> list[Any]:
    """The topologies and pipelines one module declares."""
    try:
        module = importlib.import_module(name)
    except ImportError as error:
        raise PipelineModuleError(
            f"pipeline module {name!r} cannot be imported: {error}"
        ) from error
    factory = getattr(module, "pipelines", None)
    if not callable(factory):
        raise PipelineModuleError(f"pipeline module {name!r} has no pipelines(context)")
    return flatten(factory(context))


def load(modules: Sequence[str], context: Context) -> Loaded:
    """The pipelines of each module, compiled, with what they declare."""
    items: list[Any] = []
    for name in modules:
        items.extend(declared_by(name, context))
    pipelines, global_tables = compile_all(items, context)
    return collect(pipelines, global_tables)


def collect(pipelines: list[Pipeline], global_tables: Sequence[GlobalTable]) -> Loaded:
    names = [pipeline.name for pipeline in pipelines]
    if duplicates := sorted({n for n in names if names.count(n) > 1}):
        raise PipelineModuleError(f"pipelines declared twice: {duplicates}")
    tables: dict[str, TableSpec] = {}
    sources: dict[str, SourceSpec] = {}
    for pipeline in pipelines:
        for spec in pipeline.writes:
            known = tables.setdefault(spec.name, spec)
            if known.window != spec.window:
                raise PipelineModuleError(f"table {spec.name!r} is declared with two windows")
        for source in pipeline.sources:
            sources.setdefault(source.topic, source)
    globals_: dict[str, GlobalSpec] = {}
    for table in global_tables:
        declared = GlobalSpec(table.name, table.topic, table.value_type, table.key, table.versions)
        if globals_.setdefault(declared.name, declared) != declared:
            raise PipelineModuleError(f"global table {table.name!r} is declared twice, differently")
        if table.name in tables:
            raise PipelineModuleError(f"{table.name!r} is both a table and a global table")
    return Loaded(pipelines, tables, sources, globals_)
