"""Word count: the words of every text line, counted.

The tokens of a line are those of Python's ``re.split(r"\\W+", line.lower())`` with
the empty ones dropped (``\\w`` is Unicode-aware: letters and digits of every script,
and ``_``). The counts cross a repartition topic to the partition of each word, summed
per batch first, so a fetch of thousands of lines sends a few records per partition.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator

from agents.schemas import TEXT_LINES
from streams import Context, Text, Topology

WORD_COUNTS = "word_counts"

_NON_WORD = re.compile(r"\W+")
_ASCII_NON_WORD = re.compile(rb"\W+")


def tokenize(line: str) -> Iterator[str]:
    """The words of a line, lowercased, in order."""
    return filter(None, _NON_WORD.split(line.lower()))


def tokenize_bytes(raw: bytes) -> list[str]:
    """The words of a UTF-8 encoded line; an ASCII line is split as bytes, with equal
    tokens (a word character of ASCII text is one either way)."""
    if raw.isascii():
        return [token.decode() for token in _ASCII_NON_WORD.split(raw.lower()) if token]
    return list(tokenize(raw.decode("utf-8")))


def words_of_lines(lines: list[str]) -> Iterator[str | bytes]:
    """The words of a batch of lines, all together (a vectorized step): split as one text,
    joined by spaces, which never join two words. ASCII lines are split as bytes, which
    is about twice as fast and gives the same words (as bytes: the count's keys are text
    either way)."""
    ascii_lines = [line for line in lines if line.isascii()]
    others = [line for line in lines if not line.isascii()] if len(ascii_lines) < len(lines) else []
    words: list[Iterator[str | bytes]] = []
    if ascii_lines:
        joined = " ".join(ascii_lines).encode("ascii").lower()
        words.append(filter(None, _ASCII_NON_WORD.split(joined)))
    if others:
        words.append(tokenize(" ".join(others)))
    return itertools.chain.from_iterable(words)


def pipelines(context: Context) -> Topology:
    topology = Topology("words")
    lines = topology.source(TEXT_LINES, Text)
    words = lines.flat_map(words_of_lines, vectorized=True, value_type=Text, name="words")
    words.group_by(name="by_word").count(WORD_COUNTS)
    return topology
