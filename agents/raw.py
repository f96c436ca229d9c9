"""Declaring a topic read and written as raw bytes, the way every source topic is."""

from __future__ import annotations

from typing import Any

import faust

from app.topics import TopicSpec


def raw_topic(app: faust.App, spec: TopicSpec) -> Any:
    """A raw-bytes topic faust creates (internal) with the spec's partitions and config.

    Records are validated by the agents, so a bad one reaches its dead-letter topic
    instead of being dropped by a decoder.
    """
    return app.topic(
        spec.name,
        key_type=bytes,
        value_type=bytes,
        key_serializer="raw",
        value_serializer="raw",
        partitions=spec.partitions,
        config=spec.config,
        internal=True,
    )
