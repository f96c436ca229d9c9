"""word_counts: text-lines -> tokens -> repartition by word -> count."""

from __future__ import annotations

from collections import Counter
from typing import Any

import faust
from faust import StreamT

from agents.dlq import DeadLetters
from app.semantics import InvalidEvent, decode_text_line, tokenize, tokenize_bytes
from app.settings import Settings

REPARTITION_TOPIC = "streamstate-word_counts-repartition"
#: Largest batch of lines counted together, and how long a batch may wait to fill.
BATCH_LINES = 2000
BATCH_SECONDS = 0.2


def line_tokens(raw: bytes | None, max_bytes: int) -> list[str]:
    """The tokens of a valid text line, or InvalidEvent (ASCII lines skip decoding)."""
    if raw is not None and len(raw) <= max_bytes and raw.isascii():
        return tokenize_bytes(raw)
    return tokenize(decode_text_line(raw, max_bytes))


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
    async def split_lines(stream: Any) -> None:
        # Lines are counted a batch at a time and one record per distinct word leaves the
        # batch, as Kafka Streams' record cache does: words repeat, so the repartition
        # topic, the counting agent, RocksDB and the changelog see far fewer updates.
        async for events in stream.take_events(BATCH_LINES, within=BATCH_SECONDS):
            counts: Counter[str] = Counter()
            for event in events:
                try:
                    counts.update(line_tokens(event.value, settings.max_event_bytes))
                except InvalidEvent as error:
                    await dlq.send(event, error.reason)
            for word, count in counts.items():
                await by_word.send(key=word.encode("utf-8"), value=count)

    @app.agent(by_word, name="words.count_words")
    async def count_words(stream: StreamT[int]) -> None:
        async for event in stream.events():
            word_counts[event.key] += int(event.value)
