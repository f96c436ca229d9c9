"""word_counts: text-lines -> tokens -> repartition by word -> count.

Both steps work per fetched batch of one source partition. The split step keeps no
state and reads ``text-lines`` with a consumer group of its own, outside faust's
streams (``app/direct.py``); the count step is a faust agent with the table
(``tables/batch.py``). The split step counts the batch's words and sends, to each
partition of the repartition topic, one record with the counts of the words that
partition owns (the words' murmur2 partition, as for keyed records); the count step
adds up a batch's records per word and writes each word once to RocksDB and the
changelog. A fetch of thousands of lines thus makes a few records per partition instead of
one per word.

A repartition record's value is a JSON object ``{word: count}``; a record keyed by the
word with an integer count (the per-word format) is counted too.
"""

from __future__ import annotations

import functools
from collections import Counter, defaultdict
from collections.abc import Iterator
from typing import Any

import faust
import orjson

from agents.dlq import DeadLetters
from app.direct import DirectSource
from app.semantics import InvalidEvent, ascii_token_counts, decode_text_line, tokenize
from app.settings import Settings
from app.topics import TEXT_LINES, partition_for, source_groups
from tables.batch import BatchProcessor, Output, PartitionBatch, decode_value, encode_value, read

REPARTITION_TOPIC = "streamstate-word_counts-repartition"

#: A repartition record holds words until its JSON reaches about this many bytes.
RECORD_BYTES = 256 * 1024


def chunks(counts: dict[str, int], limit: int = RECORD_BYTES) -> Iterator[dict[str, int]]:
    """``counts`` in pieces whose JSON stays near ``limit`` bytes (one word may exceed it)."""
    piece: dict[str, int] = {}
    size = 2
    for word, count in counts.items():
        cost = len(word.encode("utf-8")) + 16
        if piece and size + cost > limit:
            yield piece
            piece, size = {}, 2
        piece[word] = count
        size += cost
    if piece:
        yield piece


@functools.lru_cache(maxsize=1 << 16)
def word_partition(word: str, partitions: int) -> int:
    """The repartition topic's partition of ``word`` (cached: words recur)."""
    return partition_for(word.encode("utf-8"), partitions)


def split_batch(
    tp: Any, records: list[Any], settings: Settings, dlq: DeadLetters, partitions: int
) -> PartitionBatch:
    """One partition's lines -> per repartition partition, the counts of its words.

    ``records`` are the partition's fetched records (``topic``, ``partition``,
    ``offset``, ``key``, ``value``), in offset order."""
    batch = PartitionBatch(tp, records[-1].offset)
    counts: Counter[str] = Counter()
    limit = settings.max_event_bytes
    ascii_lines = []
    for record in records:
        value = record.value
        if value is not None and len(value) <= limit and value.isascii():
            ascii_lines.append(value)
            continue
        try:
            counts.update(tokenize(decode_text_line(value, limit)))
        except InvalidEvent as error:
            batch.send(dlq.record_of(record, error.reason))
    for token, count in ascii_token_counts(ascii_lines).items():
        counts[token.decode()] += count
    by_partition: defaultdict[int, dict[str, int]] = defaultdict(dict)
    for word, count in counts.items():
        by_partition[word_partition(word, partitions)][word] = count
    # Where the counts come from, for tracing a count back to its lines.
    first = records[0].offset
    origin = [("source", f"{tp.topic}:{tp.partition}:{first}-{batch.last_offset}".encode())]
    for partition, words in sorted(by_partition.items()):
        for piece in chunks(words):
            batch.send(
                Output(REPARTITION_TOPIC, None, orjson.dumps(piece), partition, None, origin)
            )
    return batch


def added_counts(events: list[Any]) -> Counter[bytes]:
    """The words of a batch of repartition records, each with its added count."""
    added: Counter[bytes] = Counter()
    for event in events:
        value = event.value
        if isinstance(value, dict):
            for word, count in value.items():
                added[word.encode("utf-8")] += int(count)
        else:
            added[event.key] += int(value)
    return added


def count_batch(tp: Any, events: list[Any], word_counts: Any) -> PartitionBatch:
    """One partition's repartition records -> the new count of each word they name."""
    batch = PartitionBatch(tp, max(event.message.offset for event in events))
    for word, count in added_counts(events).items():
        current = read(word_counts, tp.partition, word)
        total = count + (0 if current is None else int(decode_value(word_counts, current)))
        batch.set(word_counts, word, encode_value(word_counts, total))
    return batch


def register(
    app: faust.App,
    settings: Settings,
    word_counts: Any,
    dlq: DeadLetters,
    processor: BatchProcessor,
) -> DirectSource:
    """Declare the count agent on ``app``; return the split stage, a service to run with
    the worker."""
    partitions = settings.topic_partitions
    by_word = app.topic(
        REPARTITION_TOPIC,
        key_type=bytes,
        key_serializer="raw",
        value_serializer="json",
        partitions=partitions,
        internal=True,
    )
    processor.gate_topic(by_word)
    size, within = settings.batch_max_events, settings.batch_within_s

    @app.agent(by_word, name="words.count_words")
    async def count_words(stream: Any) -> None:
        async for events in stream.take_events(size, within):
            await processor.run(
                events, lambda tp, group: count_batch(tp, group, word_counts), [word_counts]
            )

    return DirectSource(
        app=app,
        settings=settings,
        topic=TEXT_LINES,
        group=source_groups(app.conf.id)[TEXT_LINES],
        name="words.split_lines",
        build=lambda tp, records: split_batch(tp, records, settings, dlq, partitions),
    )
