"""Is the Kafka cluster reachable? Read from the worker's own consumer connections.

faust keeps a worker alive while its brokers are gone (and it should), so readiness
must ask separately: a worker with no live connection to any broker processes nothing
and must not be reported ready. The answer comes from the connections the consumer
already keeps, not from new probe connections: connecting to a stopped broker's port
on loopback can connect the socket to itself (TCP self-connect) and keep the broker
from binding its port again.
"""

from __future__ import annotations

from typing import Any

from tables.faust_adapter import broker_connected


def consumer_connected(worker: Any) -> bool | None:
    """True if the worker's Kafka consumer holds a live broker connection, False if it
    holds none, None before the consumer has started."""
    try:
        return broker_connected(worker)
    except Exception:  # the consumer has not been created yet
        return None
