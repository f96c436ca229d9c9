"""word_counts: text-lines -> tokens -> repartition by word -> count.

Two pipelines. ``words.split`` reads ``text-lines``, counts each batch's words and sends,
to each partition of the repartition topic, one record with the counts of the words that
partition owns (the words' murmur2 partition, as for keyed records): a fetch of
thousands of lines makes a few records per partition instead of one per word.
``words.count`` adds up a batch's repartition records per word and writes each word once.

A repartition record's value is a JSON object ``{word: count}``; a record keyed by the
word with an integer count (the per-word format) is counted too.
"""

from __future__ import annotations

import functools
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence

import orjson

from core.semantics import InvalidEvent, ascii_token_counts, decode_text_line, tokenize
from core.topics import TEXT_LINES, dlq_topic, partition_for
from tables.definitions import WORD_COUNTS
from tables.pipeline import Batch, Context, Pipeline, SourceRecord, TableSpec

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


def line_counts(batch: Batch, records: Sequence[SourceRecord], max_bytes: int) -> Counter[str]:
    """The words of the lines and how often each occurs; bad lines are dead-lettered."""
    counts: Counter[str] = Counter()
    ascii_lines = []
    for record in records:
        value = record.value
        if value is not None and len(value) <= max_bytes and value.isascii():
            ascii_lines.append(value)
            continue
        try:
            counts.update(tokenize(decode_text_line(value, max_bytes)))
        except InvalidEvent as error:
            batch.dead_letter(record, error.reason)
    for token, count in ascii_token_counts(ascii_lines).items():
        counts[token.decode()] += count
    return counts


def split(batch: Batch, *, partitions: int, max_bytes: int) -> None:
    """One partition's lines -> per repartition partition, the counts of its words."""
    records = batch.of(TEXT_LINES)
    by_partition: defaultdict[int, dict[str, int]] = defaultdict(dict)
    for word, count in line_counts(batch, records, max_bytes).items():
        by_partition[word_partition(word, partitions)][word] = count
    # Where the counts come from, for tracing a count back to its lines.
    span = f"{TEXT_LINES}:{batch.partition}:{records[0].offset}-{records[-1].offset}"
    origin = [("source", span.encode())]
    for partition, words in sorted(by_partition.items()):
        for piece in chunks(words):
            batch.send(
                REPARTITION_TOPIC, None, orjson.dumps(piece), partition=partition, headers=origin
            )


def added_counts(records: Sequence[SourceRecord]) -> Counter[bytes]:
    """The words of a batch of repartition records, each with its added count."""
    added: Counter[bytes] = Counter()
    for record in records:
        value = orjson.loads(record.value or b"null")
        if isinstance(value, dict):
            for word, count in value.items():
                added[word.encode("utf-8")] += int(count)
        elif record.key is not None:
            added[record.key] += int(value)
        else:
            raise ValueError(f"a repartition record without a key holds {value!r}")
    return added


def count(batch: Batch) -> None:
    """One partition's repartition records -> the new count of each word they name."""
    table = batch.table(WORD_COUNTS)
    for word, added in added_counts(batch.of(REPARTITION_TOPIC)).items():
        table.put(word, (table.get(word) or 0) + added)


def pipelines(context: Context) -> list[Pipeline]:
    partitions, max_bytes = context.partitions, context.max_event_bytes
    return [
        Pipeline(
            name="words.split",
            reads=(TEXT_LINES,),
            produces=(REPARTITION_TOPIC, dlq_topic(TEXT_LINES)),
            process=functools.partial(split, partitions=partitions, max_bytes=max_bytes),
        ),
        Pipeline(
            name="words.count",
            reads=(REPARTITION_TOPIC,),
            writes=(TableSpec(WORD_COUNTS, queryable=True),),
            process=count,
        ),
    ]
