"""The project's exceptions, in one flat tree."""

from __future__ import annotations


class StreamstateError(Exception):
    """Base of the project's own errors."""


class TopicLayoutError(StreamstateError):
    """Topics exist with a layout (partition count) the pipelines cannot use."""
