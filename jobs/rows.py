"""The rows the nightly job's tasks emit and compares, as Arrow schemas and as Spark's DDL
(one derived from the other). Imports no Spark: the executors' tasks use it too."""

from __future__ import annotations

import pyarrow as pa

#: Spark SQL's name of each Arrow type the rows use.
_SPARK_TYPES = {
    pa.string(): "string",
    pa.int32(): "int",
    pa.int64(): "bigint",
    pa.binary(): "binary",
}

#: A table row's columns after the table's name: where it lives, its key, its window.
TABLE_ROW_FIELDS = [
    ("partition", pa.int32()),
    ("raw_key", pa.binary()),
    ("key", pa.string()),
    ("window_start", pa.int64()),
    ("window_end", pa.int64()),
    ("value", pa.binary()),
]

#: The rows of a table, batch or live.
ROW_SCHEMA = pa.schema([("table", pa.string()), *TABLE_ROW_FIELDS])

#: What a stage's tasks emit (:mod:`jobs.tasks`): ``kind`` table, topic or figure; a
#: table row's ``name`` is its table's, a topic row's the topic's.
OUTPUT_SCHEMA = pa.schema(
    [
        ("kind", pa.string()),
        ("name", pa.string()),
        *TABLE_ROW_FIELDS,
        ("timestamp", pa.int64()),
        ("source", pa.int32()),
        ("source_offset", pa.int64()),
        ("seq", pa.int64()),
    ]
)


def ddl(schema: pa.Schema) -> str:
    """Spark's DDL of ``schema``: ``name type, ...``."""
    return ", ".join(f"{field.name} {_SPARK_TYPES[field.type]}" for field in schema)


ROW_DDL = ddl(ROW_SCHEMA)
OUTPUT_DDL = ddl(OUTPUT_SCHEMA)
