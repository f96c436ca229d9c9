"""The JVM tokeniser against the stream's own, over every code point and every kind of
malformed UTF-8: the batch must count exactly the words the stream counts."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.parquet as pq  # type: ignore[import-untyped]
import pytest
from pyspark.sql import DataFrame
from pyspark.sql import functions as sf

from core import semantics
from jobs import pytext, transforms

pytestmark = pytest.mark.batch

SIGMA = "\u03a3"


def code_points() -> Iterator[str]:
    return (chr(cp) for cp in range(0x110000) if not 0xD800 <= cp <= 0xDFFF)


def python_tokens(raw: bytes) -> list[str] | None:
    try:
        return semantics.tokenize(semantics.decode_text_line(raw))
    except semantics.InvalidEvent:
        return None


def mismatches(spark: Any, tmp_path: Path, lines: list[bytes]) -> tuple[int, list[Any]]:
    """How many lines the Java UDF tokenises otherwise than the stream, and a few of them."""
    expected = [python_tokens(raw) for raw in lines]
    table = pa.table(
        {
            "value": pa.array(lines, pa.binary()),
            "expected": pa.array(expected, pa.list_(pa.string())),
        }
    )
    path = tmp_path / "lines.parquet"
    pq.write_table(table, path)
    frame = spark.read.parquet(str(path))
    tokens = sf.call_function(transforms.WORDS_UDF, "value")
    got = frame.select("value", "expected", tokens.alias("got"))
    differs = got.where(~sf.col("got").eqNullSafe(sf.col("expected")))
    return differs.count(), differs.limit(5).collect()


def test_every_code_point_is_a_word_character_and_lowered_as_in_python(
    spark: Any, tmp_path: Path
) -> None:
    assert transforms.java_tokeniser(spark.range(1))
    chars = list(code_points())
    # Runs of consecutive code points, in capitals' company, so a run splits where Python
    # splits it and each character lowers as Python lowers it.
    lines = ["A" + "".join(chars[i : i + 31]) for i in range(0, len(chars), 31)]
    count, examples = mismatches(spark, tmp_path, [line.encode("utf-8") for line in lines])
    assert count == 0, examples


def test_capital_sigma_is_final_exactly_where_python_makes_it_final(
    spark: Any, tmp_path: Path
) -> None:
    # Each code point before, between a letter and, and after a capital sigma: its cased
    # and case-ignorable properties decide the sigma's form.
    lines = [f"{c}{SIGMA} A{c}{SIGMA} A{SIGMA}{c} {SIGMA}{c}A".encode() for c in code_points()]
    greek = "\u03a3\u0391\u03a3 \u03a3\u0391\u03a3'\u0391 \u039f\u0394\u039f\u03a3. \u03a3'\u03a3"
    lines += [greek.encode(), "A\u0345\u0345\u03a3\u0345".encode()]
    count, examples = mismatches(spark, tmp_path, lines)
    assert count == 0, examples


def malformed_utf8() -> Iterator[bytes]:
    """Every lead byte with every second byte, and every three- and four-byte prefix whose
    continuation bytes sit at the edges of their allowed ranges."""
    edges = [0x00, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xFF]
    for lead in range(0x80, 0x100):
        for second in range(0x100):
            yield bytes([0x61, lead, second, 0x62])
    for lead in range(0xE0, 0xF5):
        for second in edges:
            for third in edges:
                yield bytes([lead, second, third])
                yield bytes([lead, second, third, 0x80, 0x41])
                yield bytes([lead, second])
    yield "😀".encode()[:3]
    yield b"\xef\xbb\xbfBOM"


def test_malformed_utf8_is_rejected_exactly_where_python_rejects_it(
    spark: Any, tmp_path: Path
) -> None:
    lines = list(malformed_utf8())
    assert any(python_tokens(raw) is None for raw in lines)
    assert any(python_tokens(raw) for raw in lines if not raw.isascii())
    count, examples = mismatches(spark, tmp_path, lines)
    assert count == 0, examples


def test_word_counts_count_per_partition_as_the_stream_counts(spark: Any) -> None:
    lines = [
        "ΟΔΟΣ ὈΔΌΣ İstanbul ǅemal ﬁne x²³ ٣٤ 東京タワー".encode(),
        b"The the THE dog_2 dog_2",
        "the café CAFÉ".encode(),
        b"\xff not utf-8",
        None,
        b"long " * 20_000,
    ] * 7
    frame = spark.createDataFrame([(v,) for v in lines], "value binary").repartition(3)
    got = {r["key"]: r["count"] for r in transforms.word_counts(frame).collect()}
    want: Counter[str] = Counter()
    for raw in lines:
        tokens = python_tokens(raw) if raw is not None and len(raw) <= 64 * 1024 else None
        want.update(tokens or [])
    assert got == dict(want)


def test_the_tables_describe_this_python() -> None:
    cased, ignorable = pytext.sigma_context("A")
    assert (cased, ignorable) == (True, False)
    assert pytext.sigma_context("'") == (False, True)
    assert pytext.sigma_context(" ") == (False, False)
    assert pytext.fingerprint().startswith("py3.")


def test_a_java_class_the_driver_cannot_load_leaves_the_python_path(spark: Any) -> None:
    assert transforms.java_class(spark, "WordCounts") is not None
    assert transforms.java_class(spark, "NoSuchCounter") is None


def test_word_counts_sent_on_whenever_the_map_fills_up_add_up_the_same(spark: Any) -> None:
    lines = [b"a b c d e f", b"a a b", "ὈΔΌΣ g h".encode(), b"i j k l"] * 5
    frame = spark.createDataFrame([(v,) for v in lines], "value binary").repartition(2)
    counter = transforms.java_class(spark, "WordCounts")
    parts = DataFrame(counter.partial(frame._jdf, 64 * 1024, 2), spark)
    words = {t for raw in lines for t in semantics.tokenize(raw.decode())}
    assert parts.count() > 2 * len(words)  # the maps were sent on many times
    summed = parts.groupBy("key").agg(sf.sum("count").alias("count"))
    assert {r["key"]: r["count"] for r in summed.collect()} == {
        r["key"]: r["count"] for r in transforms.word_counts(frame).collect()
    }
