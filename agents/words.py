"""Word count: the words of every text line, counted.

The tokens of a line are those of Python's ``re.split(r"\\W+", line.lower())`` with
the empty ones dropped (``\\w`` is Unicode-aware: letters and digits of every script,
and ``_``). The counts cross a repartition topic to the partition of each word, summed
per batch first, so a fetch of thousands of lines sends a few records per partition.
"""

from __future__ import annotations

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


def pipelines(context: Context) -> Topology:
    topology = Topology("words")
    lines = topology.source(TEXT_LINES, Text)
    lines.flat_map(tokenize, value_type=Text).group_by(name="by_word").count(WORD_COUNTS)
    return topology
