"""What each topic takes: the record size, key and timestamp rules a broker enforces.

A broker refuses a whole record batch for one record that breaks its topic's rules, and
aiokafka's idempotent producer cannot send to that partition again afterwards. So the
engine checks every record it is about to send against the rules of its topic first
(:func:`refusal`), and stamps the records it times itself with a timestamp the topic
takes (:func:`stamp`). The rules come from the broker (``describe_configs`` of each
topic, the broker's defaults where a topic sets nothing): :func:`topic_limits`.

The rules, as Kafka 4 applies them to a produced record batch:

* ``max.message.bytes``: the largest record batch, in bytes, after compression (the
  engine does not compress): :func:`record_batch_bytes` is the exact size of a batch
  that holds one record.
* ``cleanup.policy`` with ``compact``: every record needs a key.
* ``message.timestamp.type=CreateTime`` (the default): a record's timestamp may be at
  most ``message.timestamp.after.max.ms`` ahead of the broker's clock (1 hour by
  default) and at most ``message.timestamp.before.max.ms`` behind it (unlimited by
  default). ``LogAppendTime``: the broker sets the timestamp itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

#: The largest request the engine's producers send; a record batch is never larger.
MAX_REQUEST_BYTES = 4 * 1024 * 1024
#: Kafka's defaults (broker 4.x), used for a topic the broker has not described.
DEFAULT_MAX_MESSAGE_BYTES = 1_048_588
DEFAULT_AFTER_MAX_MS = 3_600_000
#: Kafka's way of saying "unlimited" for the timestamp bounds (Long.MAX_VALUE).
UNLIMITED = 2**63 - 1
#: The header of a record batch (magic 2): base offset .. record count.
BATCH_HEADER_BYTES = 61
#: The most a record's own framing adds to its key, value and headers inside a batch
#: (attributes, offset and timestamp deltas, length: varints), as aiokafka bounds it.
RECORD_OVERHEAD_BYTES = 21
#: How close to a topic's timestamp bound the engine stamps: the worker's clock and the
#: broker's may differ, and a record takes a moment to reach the broker.
CLOCK_MARGIN_MS = 60_000

#: Names of the errors Kafka answers for a record it refuses for that record's sake.
#: A broker answers INVALID_RECORD (a compacted topic and no key, say) with an error code
#: aiokafka does not know: it raises UnknownError.
REFUSALS = frozenset(
    {
        "MessageSizeTooLargeError",
        "RecordTooLargeError",
        "RecordListTooLargeError",
        "InvalidTimestampError",
        "CorruptRecordException",
        "InvalidRecordError",
    }
)
#: Names of the errors that follow another batch's failure on the same partition: the
#: producer's sequence numbers went on past the refused batch, and the broker refuses
#: every later batch until the producer is replaced.
AFTERMATH = frozenset({"OutOfOrderSequenceNumber"})


@dataclass(frozen=True, slots=True)
class TopicLimits:
    """The rules one topic applies to the records produced to it."""

    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    compacted: bool = False
    #: the broker sets timestamps itself (``LogAppendTime``): none is refused
    log_append_time: bool = False
    #: how far ahead of / behind the broker's clock a timestamp may be (None: unlimited)
    after_max_ms: int | None = DEFAULT_AFTER_MAX_MS
    before_max_ms: int | None = None

    def time_refusal(self, timestamp: int, now_ms: int, margin_ms: int = 0) -> str | None:
        """Why the topic refuses ``timestamp`` at ``now_ms`` (None: it takes it)."""
        if self.log_append_time:
            return None
        ahead = timestamp - now_ms
        if self.after_max_ms is not None and ahead > self.after_max_ms - _margin(
            self.after_max_ms, margin_ms
        ):
            return (
                f"timestamp {timestamp} is {ahead:,} ms ahead of the clock; the topic takes "
                f"at most {self.after_max_ms:,} ms ahead (message.timestamp.after.max.ms)"
            )
        if self.before_max_ms is not None and -ahead > self.before_max_ms - _margin(
            self.before_max_ms, margin_ms
        ):
            return (
                f"timestamp {timestamp} is {-ahead:,} ms behind the clock; the topic takes "
                f"at most {self.before_max_ms:,} ms behind (message.timestamp.before.max.ms)"
            )
        return None


def _margin(bound: int, margin: int) -> int:
    return min(margin, bound // 10)


def _varint_size(value: int) -> int:
    """Bytes of ``value`` as a zigzag varint (Kafka's record fields)."""
    value = (value << 1) ^ (value >> 63)
    size = 1
    while value > 0x7F:
        value >>= 7
        size += 1
    return size


def _field_size(data: bytes | None) -> int:
    return 1 if data is None else _varint_size(len(data)) + len(data)


def record_batch_bytes(
    key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes]] | None = None
) -> int:
    """The size of a record batch holding just this record, uncompressed: what the broker
    compares with ``max.message.bytes``."""
    body = 3 + _field_size(key) + _field_size(value)  # attributes, offset and time deltas
    headers = headers or []
    body += _varint_size(len(headers))
    for name, data in headers:
        body += _field_size(name.encode("utf-8")) + _field_size(data)
    return BATCH_HEADER_BYTES + _varint_size(body) + body


def record_bytes_bound(
    key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes]] | None = None
) -> int:
    """At most what the record adds to a record batch (for filling batches)."""
    return record_batch_bytes(key, value, headers) - BATCH_HEADER_BYTES + RECORD_OVERHEAD_BYTES


def refusal(
    topic: str,
    key: bytes | None,
    value: bytes | None,
    headers: list[tuple[str, bytes]] | None,
    timestamp: int | None,
    limits: TopicLimits,
    now_ms: int,
    max_bytes: int,
) -> str | None:
    """Why ``topic`` would refuse this record (Kafka's error name first), or None.

    ``max_bytes`` is the size limit that applies: the topic's ``max.message.bytes``, or
    less when the producer sends less. ``timestamp`` None: the producer stamps it now."""
    if key is None and limits.compacted:
        return (
            f"InvalidRecordError: topic {topic} is compacted (cleanup.policy=compact) and "
            "takes no record without a key"
        )
    # Cheap first: a record well below the limit needs no exact count.
    if (0 if key is None else len(key)) + (0 if value is None else len(value)) + 512 > max_bytes:
        size = record_batch_bytes(key, value, headers)
        if size > max_bytes:
            return (
                f"MessageSizeTooLargeError: the record is {size:,} bytes as a record batch; "
                f"topic {topic} takes at most {max_bytes:,} (max.message.bytes)"
            )
    if timestamp is not None:
        why = limits.time_refusal(timestamp, now_ms)
        if why is not None:
            return f"InvalidTimestampError: topic {topic}: {why}"
    return None


def stamp(input_ms: int, limits: TopicLimits, now_ms: int) -> int:
    """The timestamp of a record the engine times itself: the input's (Kafka Streams'
    rule), or the worker's clock when the input has none or the topic would refuse it
    (an input record may come from a topic that takes more than this one)."""
    if input_ms < 0 or limits.time_refusal(input_ms, now_ms, CLOCK_MARGIN_MS) is not None:
        return now_ms
    return input_ms


def _bound(raw: str | None, default: int | None) -> int | None:
    if raw is None:
        return default
    value = int(raw)
    return None if value >= UNLIMITED or value < 0 else value


def topic_limits(config: Mapping[str, str], broker: Mapping[str, str]) -> TopicLimits:
    """A topic's limits from its described configuration, the broker's defaults (the
    ``log.``-prefixed names, and ``message.max.bytes``) where it has none."""

    def get(name: str, broker_name: str) -> str | None:
        found = config.get(name)
        return found if found is not None else broker.get(broker_name)

    size = get("max.message.bytes", "message.max.bytes")
    policy = get("cleanup.policy", "log.cleanup.policy") or "delete"
    kind = get("message.timestamp.type", "log.message.timestamp.type") or "CreateTime"
    after = get("message.timestamp.after.max.ms", "log.message.timestamp.after.max.ms")
    before = get("message.timestamp.before.max.ms", "log.message.timestamp.before.max.ms")
    return TopicLimits(
        max_message_bytes=int(size) if size is not None else DEFAULT_MAX_MESSAGE_BYTES,
        compacted="compact" in policy.split(","),
        log_append_time=kind == "LogAppendTime",
        after_max_ms=_bound(after, DEFAULT_AFTER_MAX_MS),
        before_max_ms=_bound(before, None),
    )


def kafka_reason(error: BaseException, topic: str, partition: int) -> str:
    """What a refusal Kafka answered says, for a dead letter's ``error`` header."""
    name = type(error).__name__
    code = getattr(error, "errno", None)
    description = getattr(error, "description", None) or str(error)
    where = f"topic {topic} partition {partition}"
    return f"{name}{f' [Error {code}]' if code is not None else ''}: {description} ({where})"
