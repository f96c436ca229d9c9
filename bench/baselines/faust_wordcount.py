"""The faust baseline of word counting: a plain per-event agent on a RocksDB table.

    BROKER_URL=kafka://127.0.0.1:25092 faust --datadir DIR \
        -A bench.baselines.faust_wordcount worker -l info --web-port PORT

What a faust user writes first: every line is one event, every word one ``+= 1`` on a
faust Table in RocksDB with its changelog. Its own app id, so its own consumer group,
changelog and state.
"""

from __future__ import annotations

import os
from typing import Any

import faust

from agents.words import tokenize_bytes

APP_ID = "bench-faust-wordcount"

app = faust.App(
    APP_ID,
    broker=os.environ.get("BROKER_URL", "kafka://127.0.0.1:25092"),
    store="rocksdb://",
    topic_partitions=int(os.environ.get("TOPIC_PARTITIONS", "8")),
    consumer_auto_offset_reset="earliest",
    autodiscover=False,
)

lines = app.topic("text-lines", key_type=bytes, value_type=bytes, value_serializer="raw")
word_counts: Any = app.Table("word_counts", default=int, key_type=str, value_type=int)


@app.agent(lines)
async def count_words(stream: Any) -> None:
    async for line in stream:
        for word in tokenize_bytes(line):
            word_counts[word] += 1
