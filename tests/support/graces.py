"""A pipeline module with three windowed aggregations, each with a grace, over one source:
each aggregation judges lateness against the event time of the records before it in its
partition, whatever the others do and however the records fall into batches. The streams
API tests and the nightly job's tests run it.

Values are JSON: ``clicks`` ``{"user", "ts"}`` keyed by user.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

from streams import Hopping, Json, Session, Topology, Tumbling
from tables.pipeline import Context
from tables.windows import AnyWindow

CLICKS = "clicks"
#: Each table's window: 5-minute tumbling, sessions of 5-minute gaps, 10-minute hopping
#: every 5 minutes.
WINDOWS: dict[str, AnyWindow] = {
    "clicks_per_5m": Tumbling(timedelta(minutes=5), grace=timedelta(minutes=2)),
    "click_sessions": Session(timedelta(minutes=5), grace=timedelta(minutes=1)),
    "clicks_per_10m": Hopping(
        timedelta(minutes=10), timedelta(minutes=5), grace=timedelta(minutes=2)
    ),
}


def clicks_topology(tables: Sequence[str] = tuple(WINDOWS)) -> Topology:
    """The counts of ``tables``, declared in that order."""
    topology = Topology("clicks")
    clicks = topology.source(CLICKS, Json, key="user", timestamp="ts")
    for table in tables:
        clicks.group_by_key().window_by(WINDOWS[table]).count(table)
    return topology


def pipelines(context: Context) -> Topology:
    return clicks_topology()
