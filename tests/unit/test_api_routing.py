"""The query layer's pure logic: partitions, cursors, answer ranking, windows, merging."""

from __future__ import annotations

import random

import pytest
from aiokafka.partitioner import DefaultPartitioner
from aiokafka.partitioner import murmur2 as aiokafka_murmur2

from api.errors import BadRequest
from api.local import Window
from api.peers import PeerAnswer, quote_segment
from api.queries import best_answer, encode_key, relayable, window_at, windows_between
from api.routes.internal import parse_partitions
from api.routing import normalize_url
from api.scans import PartitionPage, better, decode_cursor, encode_cursor, merge
from core.topics import murmur2, partition_for

HOUR = 3_600_000


@pytest.mark.parametrize("key", [b"the", b"store-001", "café".encode(), b"x" * 300])
def test_partition_is_the_producers_murmur2(key: bytes) -> None:
    partitions = list(range(8))
    assert partition_for(key, 8) == DefaultPartitioner()(key, partitions, partitions)


@pytest.mark.parametrize(
    ("text", "java"),
    [  # Kafka's own test vectors for Utils.murmur2, as Java's signed int
        ("21", -973932308),
        ("foobar", -790332482),
        ("a-little-bit-long-string", -985981536),
        ("a-little-bit-longer-string", -1486304829),
        ("lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
    ],
)
def test_murmur2_is_the_java_clients(text: str, java: int) -> None:
    assert murmur2(text.encode()) == java & 0xFFFFFFFF


def test_murmur2_agrees_with_aiokafkas_for_every_length() -> None:
    rng = random.Random(7)
    for length in range(40):
        for _ in range(50):
            data = rng.randbytes(length)
            assert murmur2(data) == aiokafka_murmur2(data), data


def test_keys_are_validated_as_utf8_bytes() -> None:
    assert encode_key("café") == "café".encode()
    with pytest.raises(BadRequest, match="empty"):
        encode_key("")
    with pytest.raises(BadRequest, match="UTF-8"):
        encode_key("\udcff")
    with pytest.raises(BadRequest, match="exceeds"):
        encode_key("é" * 600)


def test_cursor_round_trips_and_refuses_another_scan() -> None:
    cursor = encode_cursor("word_counts", "th", "the")
    assert decode_cursor(cursor, "word_counts", "th") == "the"
    with pytest.raises(BadRequest):
        decode_cursor(cursor, "inventory", "th")
    with pytest.raises(BadRequest):
        decode_cursor(cursor, "word_counts", "")
    with pytest.raises(BadRequest, match="empty"):
        decode_cursor("", "word_counts", "th")
    for garbage in ("garbage", "!!!", "eyJ0IjoxfQ"):
        with pytest.raises(BadRequest):
            decode_cursor(garbage, "word_counts", "th")


def answer(status: int, replica: str, lag: int | None, url: str = "u") -> PeerAnswer:
    return PeerAnswer(url, status, {"replica": replica, "offset_lag": lag})


def test_best_answer_prefers_active_then_least_lag_then_found() -> None:
    behind, fresh = answer(200, "standby", 4, "a"), answer(200, "standby", 0, "b")
    assert best_answer([behind, fresh]) is fresh
    active = answer(404, "active", 0, "c")
    assert best_answer([fresh, active]) is active
    assert best_answer([answer(404, "standby", 0, "a"), fresh]) is fresh
    assert best_answer([answer(200, "standby", None, "a"), behind]) is behind


def test_answers_without_a_copy_are_not_usable() -> None:
    refused = PeerAnswer("a", 421, {"detail": "no copy"})
    failed = PeerAnswer("b", 503, {"detail": "x"})
    assert best_answer([None, refused, failed]) is None
    assert not relayable(refused)
    assert not relayable(failed)
    assert relayable(answer(404, "active", 0))


def test_windows_are_half_open_intervals() -> None:
    windows = [Window(0, HOUR, 1), Window(HOUR, 2 * HOUR, 2), Window(5 * HOUR, 6 * HOUR, 3)]
    assert window_at(windows, HOUR - 1) == windows[0]
    assert window_at(windows, HOUR) == windows[1]
    assert window_at(windows, 3 * HOUR) is None
    assert windows_between(windows, HOUR, 5 * HOUR) == windows[1:]
    assert windows_between(windows, HOUR + 1, 5 * HOUR - 1) == [windows[1]]


def test_merge_keeps_limit_keys_in_byte_order_and_reports_partitions() -> None:
    pages = {
        0: PartitionPage(0, "active", 0, [{"key": "b", "value": 1}, {"key": "é", "value": 2}]),
        1: PartitionPage(1, "standby", 3, [{"key": "a", "value": 3}, {"key": "z", "value": 4}]),
    }
    page = merge("t", "", pages, 3, 3)
    assert [i["key"] for i in page["items"]] == ["a", "b", "z"]
    assert [i["partition"] for i in page["items"]] == [1, 0, 1]  # each key's positions entry
    assert decode_cursor(page["next_cursor"], "t", "") == "z"
    assert page["partitions"] == {"served": [0], "stale": [1], "missing": [2]}
    assert merge("t", "", pages, 2, 4)["next_cursor"] is None


def test_a_partition_with_more_keys_keeps_the_cursor() -> None:
    pages = {0: PartitionPage(0, "active", 0, [{"key": "a", "value": 1}], more=True)}
    assert merge("t", "", pages, 1, 5)["next_cursor"] is not None


def test_better_page_prefers_active_then_least_lag() -> None:
    standby = PartitionPage(0, "standby", 2)
    assert better(standby, None)
    assert better(PartitionPage(0, "active", 0), standby)
    assert better(PartitionPage(0, "standby", 0), standby)
    assert not better(PartitionPage(0, "standby", None), standby)


def test_internal_partition_lists_are_checked() -> None:
    assert parse_partitions("3,1,1", 8) == [1, 3]
    with pytest.raises(BadRequest):
        parse_partitions("1,x", 8)
    with pytest.raises(BadRequest):
        parse_partitions("8", 8)


def test_path_segments_survive_slashes_and_dots() -> None:
    assert quote_segment("a/b") == "a%2Fb"
    assert quote_segment("..") == "%2E%2E"
    assert quote_segment("café?") == "caf%C3%A9%3F"
    assert normalize_url("http://h:1/") == "http://h:1"


def test_an_absent_key_is_an_answer_only_from_the_active_copy() -> None:
    assert best_answer([answer(404, "standby", 3, "a")]) is None
    assert best_answer([answer(404, "standby", None, "a")]) is None
    # a lag of 0 is measured against the changelog end the copy last fetched: the
    # active may have written the key since
    assert best_answer([answer(404, "standby", 0, "a")]) is None
    found = answer(200, "standby", 3, "b")
    assert best_answer([answer(404, "standby", None, "a"), found]) is found
    active = answer(404, "active", 0, "c")
    assert best_answer([answer(200, "standby", 2, "a"), active]) is active


def test_no_window_in_a_range_is_absent_too() -> None:
    empty = PeerAnswer("a", 200, {"replica": "standby", "offset_lag": 0, "windows": []})
    assert best_answer([empty]) is None
    held = PeerAnswer("b", 200, {"replica": "standby", "offset_lag": 1, "windows": [{}]})
    assert best_answer([empty, held]) is held
    none_here = PeerAnswer("c", 200, {"replica": "active", "offset_lag": 0, "windows": []})
    assert best_answer([empty, none_here]) is none_here
