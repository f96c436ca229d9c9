"""word_counts: text-lines -> tokens -> repartition by word -> count."""

from __future__ import annotations

from collections import Counter
from typing import Any

import faust
from faust import StreamT

from agents.dlq import DeadLetters
from app.semantics import InvalidEvent, decode_text_line, tokenize
from app.settings import Settings

REPARTITION_TOPIC = "streamstate-word_counts-repartition"


def register(
    app: faust.App, settings: Settings, source: Any, word_counts: Any, dlq: DeadLetters
) -> None:
    """Declare the word-count agents on ``app``."""
    by_word = app.topic(
        REPARTITION_TOPIC,
        key_type=bytes,
        key_serializer="raw",
        value_serializer="json",
        partitions=settings.topic_partitions,
        internal=True,
    )

    @app.agent(source, name="words.split_lines")
    async def split_lines(stream: StreamT[bytes]) -> None:
        async for event in stream.events():
            try:
                line = decode_text_line(event.value, settings.max_event_bytes)
            except InvalidEvent as error:
                await dlq.send(event, error.reason)
                continue
            for word, count in Counter(tokenize(line)).items():
                await by_word.send(key=word.encode("utf-8"), value=count)

    @app.agent(by_word, name="words.count_words")
    async def count_words(stream: StreamT[int]) -> None:
        async for event in stream.events():
            word_counts[event.key] += int(event.value)
