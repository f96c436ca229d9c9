"""streamstate's streams API: pipelines declared as sources, steps, windows, joins,
aggregations into queryable tables, and outputs.

A pipeline module has a ``pipelines(context)`` function that returns topologies (and,
where a batch function fits better, ``tables.pipeline.Pipeline`` objects)::

    from streams import Text, Topology

    def pipelines(context):
        topology = Topology("words")
        lines = topology.source("lines", Text)
        lines.flat_map(str.split).group_by().count("counts")
        return topology

The worker compiles each topology into batch functions that its engine runs
exactly-once, serves every table it writes over HTTP, and the nightly job recomputes
them from the same declaration. :class:`streams.testing.TestDriver` runs a topology in
process, without a broker. See docs/streams.md.
"""

from core.values import Bytes, InvalidEvent, Json, Model, Text, Typed, ValueType
from streams.compile import Compiled, compile_all, compile_topology
from streams.topology import GlobalTable, GroupedStream, Stream, Table, Topology, TopologyError
from tables.join import JoinWindow
from tables.pipeline import Batch, Context, Pipeline, TableSpec
from tables.windows import Hopping, Session, Tumbling

__all__ = [
    "Batch",
    "Bytes",
    "Compiled",
    "Context",
    "GlobalTable",
    "GroupedStream",
    "Hopping",
    "InvalidEvent",
    "JoinWindow",
    "Json",
    "Model",
    "Pipeline",
    "Session",
    "Stream",
    "Table",
    "TableSpec",
    "Text",
    "Topology",
    "TopologyError",
    "Tumbling",
    "Typed",
    "ValueType",
    "compile_all",
    "compile_topology",
]
