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

    async def send(self, event: Any, reason: str) -> None:
        """Publish the event's original bytes to its source's dead-letter topic."""
        message = event.message
        headers: list[tuple[str, bytes]] = [
            ("error", reason.encode("utf-8")),
            ("source-topic", message.topic.encode()),
            ("source-partition", str(message.partition).encode()),
            ("source-offset", str(message.offset).encode()),
        ]
        topic: Any = self.topics[message.topic]
        await topic.send(key=message.key, value=message.value, headers=headers)
        self.sent[message.topic] += 1
        logger.warning(
            "dead letter %s[%d]@%d: %s", message.topic, message.partition, message.offset, reason
        )
