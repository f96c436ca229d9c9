"""The dead-letter path: a record that fails validation goes to ``<source>-dlq``.

The original key and value bytes are kept and the headers say why and where from, so
nothing is lost and a fixed record can be replayed from the dead-letter topic.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

import faust

from app.topics import dlq_topic
from tables.batch import Output

logger = logging.getLogger(__name__)


class DeadLetters:
    """Sends invalid records of the source topics to their dead-letter topics."""

    def __init__(
        self, app: faust.App, sources: list[str], partitions: int, retention_ms: int
    ) -> None:
        self.topics = {
            source: app.topic(
                dlq_topic(source),
                key_type=bytes,
                value_type=bytes,
                key_serializer="raw",
                value_serializer="raw",
                partitions=partitions,
                config={"retention.ms": str(retention_ms)},
                internal=True,
            )
            for source in sources
        }
        self.sent: Counter[str] = Counter()

    def record(self, event: Any, reason: str) -> Output:
        """The dead-letter record of an event, for a batch to publish with its outputs."""
        return self.record_of(event.message, reason)

    def record_of(self, message: Any, reason: str) -> Output:
        """The dead-letter record of a fetched record (a faust Message or an aiokafka
        ConsumerRecord: ``topic``, ``partition``, ``offset``, ``key``, ``value``)."""
        headers: list[tuple[str, bytes]] = [
            ("error", reason.encode("utf-8")),
            ("source-topic", message.topic.encode()),
            ("source-partition", str(message.partition).encode()),
            ("source-offset", str(message.offset).encode()),
        ]
        self.sent[message.topic] += 1
        logger.warning(
            "dead letter %s[%d]@%d: %s", message.topic, message.partition, message.offset, reason
        )
        return Output(dlq_topic(message.topic), message.key, message.value, headers=headers)

    async def send(self, event: Any, reason: str) -> None:
        """Publish the event's original bytes to its source's dead-letter topic."""
        out = self.record(event, reason)
        topic: Any = self.topics[event.message.topic]
        await topic.send(key=out.key, value=out.value, headers=out.headers)
