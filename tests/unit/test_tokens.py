"""Position tokens: round trips, every refusal reason, and their size."""

from __future__ import annotations

import base64
import random
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agents.schemas import SOURCE_TOPICS
from api.tokens import (
    MAX_OFFSET,
    MAX_PARTITION,
    MAX_PARTITIONS,
    MAX_TOKEN_CHARS,
    TOKEN_BUDGET_CHARS,
    VERSION,
    Token,
    TokenError,
    decode_token,
    encode_token,
)

APP = "streamstate"

topics = st.sampled_from(SOURCE_TOPICS)
positions = st.dictionaries(
    st.integers(0, MAX_PARTITION), st.integers(0, MAX_OFFSET), max_size=MAX_PARTITIONS
)
small_topic_positions = st.dictionaries(st.integers(0, 7), st.integers(0, 10**12), max_size=8)


def raw(text: str) -> bytearray:
    return bytearray(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))


def text(data: bytes | bytearray) -> str:
    return base64.urlsafe_b64encode(bytes(data)).rstrip(b"=").decode()


def reason(text: str, app: str = APP) -> str:
    with pytest.raises(TokenError) as error:
        decode_token(text, app, topics=SOURCE_TOPICS)
    return error.value.reason


@given(topics, positions)
def test_any_token_survives_a_round_trip(topic: str, where: dict[int, int]) -> None:
    token = Token(topic, where)
    assert decode_token(encode_token(token, APP), APP, topics=SOURCE_TOPICS) == token


@given(topics, small_topic_positions)
def test_tokens_of_an_eight_partition_topic_round_trip(topic: str, where: dict[int, int]) -> None:
    token = Token(topic, where)
    assert decode_token(encode_token(token, APP), APP, topics=SOURCE_TOPICS) == token


@given(topics, positions)
def test_a_token_is_base64url_text_without_padding(topic: str, where: dict[int, int]) -> None:
    encoded = encode_token(Token(topic, where), APP)
    assert re.fullmatch(r"[A-Za-z0-9_-]+", encoded)
    assert len(encoded) <= MAX_TOKEN_CHARS


@given(topics, positions)
def test_encoding_is_deterministic_whatever_the_dict_order(
    topic: str, where: dict[int, int]
) -> None:
    reversed_order = dict(reversed(list(where.items())))
    assert encode_token(Token(topic, where), APP) == encode_token(Token(topic, reversed_order), APP)


def test_positions_come_back_as_given() -> None:
    token = decode_token(
        encode_token(Token("payments", {3: 17, 0: 5}), APP), APP, topics=SOURCE_TOPICS
    )
    assert token.topic == "payments"
    assert token.positions == {0: 5, 3: 17}


def test_a_token_may_name_another_known_topic() -> None:
    encoded = encode_token(Token("extra-source", {0: 1}), APP)
    assert decode_token(encoded, APP, topics={"extra-source"}).topic == "extra-source"


# -- refusals --------------------------------------------------------------------------

GOOD = encode_token(Token("item-events", {0: 10, 5: 99}), APP)


def test_text_that_is_not_base64url_is_refused() -> None:
    assert reason("abc+def/") == "not-base64url"
    assert reason("abcd==") == "not-base64url"
    assert reason("") == "not-base64url"
    assert reason("a") == "not-base64url"
    assert reason("tökén") == "not-base64url"


def test_text_beyond_the_limit_is_refused_unread() -> None:
    assert reason("A" * (MAX_TOKEN_CHARS + 1)) == "too-long"
    assert reason("!" * (MAX_TOKEN_CHARS + 1)) == "too-long"


def test_another_version_is_refused() -> None:
    data = raw(GOOD)
    data[0] = VERSION + 1
    assert reason(text(data)) == "bad-version"


def test_an_altered_token_fails_its_checksum() -> None:
    data = raw(GOOD)
    data[-6] ^= 0x01  # an offset bit
    assert reason(text(data)) == "malformed"


def test_a_cut_token_fails_its_checksum() -> None:
    assert reason(GOOD[:-3]) == "malformed"
    assert reason(GOOD[:4]) == "malformed"


def test_a_token_of_another_app_is_foreign() -> None:
    assert reason(GOOD, app="another-app") == "foreign"


def test_a_token_of_a_topic_that_is_not_a_source_is_refused() -> None:
    encoded = encode_token(Token("settled-sales", {0: 1}), APP)
    assert reason(encoded) == "unknown-topic"


def test_every_refusal_is_a_value_error_with_a_message() -> None:
    with pytest.raises(ValueError, match="not issued by the app 'other'"):
        decode_token(GOOD, "other", topics=SOURCE_TOPICS)


@pytest.mark.parametrize(
    "bad",
    [
        Token("", {0: 1}),
        Token("t" * 256, {0: 1}),
        Token("text-lines", {-1: 1}),
        Token("text-lines", {0: -1}),
        Token("text-lines", {MAX_PARTITION + 1: 1}),
        Token("text-lines", {0: MAX_OFFSET + 1}),
        Token("text-lines", {p: 1 for p in range(MAX_PARTITIONS + 1)}),
    ],
)
def test_a_token_outside_kafkas_ranges_cannot_be_encoded(bad: Token) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - each case has its own message
        encode_token(bad, APP)


# -- size ------------------------------------------------------------------------------


def test_a_write_to_every_partition_of_eight_is_short() -> None:
    token = Token("item-events", {p: 1_000_000_000 + p * 37 for p in range(8)})
    assert len(encode_token(token, APP)) <= 64


def test_a_thousand_partitions_with_close_offsets_fit_the_budget() -> None:
    rng = random.Random(7)
    where = {p: 50_000_000 + rng.randrange(2048) for p in range(1000)}
    assert len(encode_token(Token("item-events", where), APP)) <= TOKEN_BUDGET_CHARS


def test_a_thousand_random_keys_on_a_thousand_partitions_fit_the_budget() -> None:
    rng = random.Random(11)
    written = {rng.randrange(1000) for _ in range(1000)}
    where = {p: 3_000_000_000 + rng.randrange(100_000) for p in written}
    assert len(encode_token(Token("text-lines", where), APP)) <= TOKEN_BUDGET_CHARS


def test_the_widest_possible_token_stays_under_the_decoding_limit() -> None:
    spread = MAX_PARTITION // MAX_PARTITIONS
    where = {p * spread: (MAX_OFFSET if p % 2 else 0) for p in range(MAX_PARTITIONS)}
    token = Token("x" * 255, where)
    encoded = encode_token(token, APP)
    assert len(encoded) <= MAX_TOKEN_CHARS
    assert decode_token(encoded, APP, topics={"x" * 255}) == token
