"""Records Kafka refuses, and the input records whose effects they carry.

A broker refuses a record for the record's own sake (too large for its topic, a
timestamp out of the topic's range, no key for a compacted topic), and it refuses the
whole record batch that holds it. The engine turns such a refusal into dead letters of
the input records that caused it, and applies the rest of the cycle:

1. Before sending, every record of a cycle is checked against its topic's rules
   (:mod:`tables.limits`). A refused record names what made it: the pipeline whose batch
   sent it, or the table and key of a changelog record.
2. The task then applies the cycle again with those pipelines in **small batches on
   child table views** (:class:`Plan`: ``suspects``), and checks each batch's outputs
   and its writes to the refused keys (``watch``): a batch whose effects would be
   refused is applied again in smaller ones, down to single records. A record whose own
   effects would be refused is a **culprit**: it goes to its topic's dead-letter topic
   with the reason, and none of its effects is kept, in any pipeline.
3. When Kafka refuses records the checks let through (a topic's configuration changed
   under the worker, say), the task reads the topic's rules again and applies the cycle
   again; if that does not explain the refusal, the next attempt sends the refused
   partitions' records one per record batch (``isolate``), and then applies the pipeline
   that made them one record at a time (``fine``), so that Kafka's answer names each
   refused record, and :class:`Provenance` leads from it to its input record.

Nothing here imports Kafka: producers report what Kafka did not take as
:class:`Undelivered`; the engine decides what follows (``tables/engine.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from tables.limits import AFTERMATH, REFUSALS, kafka_reason, record_batch_bytes
from tables.pipeline import ERROR_HEADER, Output, SourceRecord

#: (topic, partition, offset) of an input record.
RecordId = tuple[str, int, int]
#: (topic, partition).
Partition = tuple[str, int]


def record_id(record: SourceRecord) -> RecordId:
    return (record.topic, record.partition, record.offset)


class Produced(NamedTuple):
    """An output record and how it was made."""

    output: Output
    #: the time of the input records it came from (the largest; -1: none)
    at_ms: int
    #: the pipeline whose batch sent it (None: the engine, as a position record)
    pipeline: str | None
    #: the one input record it came from, when the batch held just that record
    source: SourceRecord | None


class Refused(NamedTuple):
    """A record of a cycle that its topic would refuse, found before sending."""

    reason: str
    #: the pipeline whose batch sent it (an output)
    pipeline: str | None = None
    #: the table and key of a changelog record
    table: str | None = None
    key: bytes | None = None
    #: the one input record it came from, when known
    source: SourceRecord | None = None


@dataclass
class Failure:
    """One record batch Kafka did not take: its partition, Kafka's error, its records."""

    tp: Partition
    error: BaseException
    records: list[Output]


class Undelivered(Exception):
    """Kafka did not take some record batches of a cycle (nothing of it takes effect)."""

    def __init__(
        self, failures: list[Failure], delivered: int, taken: Sequence[Output] = ()
    ) -> None:
        self.failures = failures
        #: record batches of the same send that Kafka took
        self.delivered = delivered
        #: the records of those batches (at_least_once: Kafka keeps them for good)
        self.taken = list(taken)
        first = failures[0]
        super().__init__(
            f"{len(failures)} record batches refused, {delivered} taken; first: "
            f"{first.tp[0]}[{first.tp[1]}]: {type(first.error).__name__}: {first.error}"
        )


def undelivered_in(error: BaseException) -> Undelivered | None:
    """The :class:`Undelivered` a failure is or arose from (a transaction's abort that
    failed too), if any."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, Undelivered):
            return seen
        seen = seen.__context__
    return None


@dataclass(frozen=True)
class SendPlan:
    """How a producer sends one cycle."""

    #: partitions whose records go one per record batch
    isolate: frozenset[Partition] = frozenset()
    #: the largest record batch each topic takes, in bytes
    batch_bytes: Callable[[str], int] | None = None


@dataclass
class Provenance:
    """Where each record of a cycle came from."""

    #: id of an output as sent -> how it was made
    made: dict[int, Produced] = field(default_factory=dict)
    #: id of a changelog record as sent -> (table, key)
    logged: dict[int, tuple[str, bytes]] = field(default_factory=dict)
    #: (table, key) -> the last input record that wrote it, in record-by-record batches
    writers: dict[tuple[str, bytes], SourceRecord] = field(default_factory=dict)
    #: table -> the pipelines that wrote it in the cycle
    table_writers: dict[str, set[str]] = field(default_factory=dict)


@dataclass
class Plan:
    """How a task applies its current cycle, after refusals taught it something."""

    #: pipelines applied in small batches whose effects are checked, down to single
    #: records where a batch's effects are refused
    suspects: set[str] = field(default_factory=set)
    #: suspects applied one record at a time (Kafka refused what a batch of them made)
    fine: set[str] = field(default_factory=set)
    #: table -> keys whose changelog records are checked after each record's write
    watch: dict[str, set[bytes]] = field(default_factory=dict)
    #: input records refused, and why: they go to their dead-letter topics
    culprits: dict[RecordId, tuple[SourceRecord, str]] = field(default_factory=dict)
    #: partitions whose records go one per record batch
    isolate: set[Partition] = field(default_factory=set)

    def admitted(self, records: Sequence[SourceRecord]) -> Sequence[SourceRecord]:
        """``records`` without the culprits."""
        if not self.culprits:
            return records
        return [r for r in records if record_id(r) not in self.culprits]

    def blame(self, record: SourceRecord, reason: str) -> bool:
        """Make ``record`` a culprit; False when it was one already."""
        rid = record_id(record)
        if rid in self.culprits:
            return False
        self.culprits[rid] = (record, reason)
        return True

    def suspect(self, pipelines: Iterable[str]) -> bool:
        new = set(pipelines) - self.suspects
        self.suspects |= new
        return bool(new)

    def watch_key(self, table: str, key: bytes) -> bool:
        keys = self.watch.setdefault(table, set())
        if key in keys:
            return False
        keys.add(key)
        return True

    def after(self, applied: Mapping[Any, int]) -> Plan:
        """The plan for the next cycle: only the culprits it has not passed yet
        (``applied``: the next offset of each (topic, partition))."""
        kept = {
            rid: found
            for rid, found in self.culprits.items()
            if rid[2] >= applied.get((rid[0], rid[1]), -1)
        }
        return Plan(culprits=kept)


def learn_refusals(plan: Plan, refusals: Iterable[Refused], writers: Provenance) -> bool:
    """Take what the checks before sending refused into ``plan``; False when it has
    nothing new to try (the refused records are the engine's own)."""
    learned = False
    for refused in refusals:
        if refused.source is not None:
            learned |= plan.blame(refused.source, refused.reason)
        elif refused.pipeline is not None:
            learned |= plan.suspect([refused.pipeline])
        elif refused.table is not None and refused.key is not None:
            learned |= plan.watch_key(refused.table, refused.key)
            learned |= plan.suspect(writers.table_writers.get(refused.table, ()))
    return learned


class Lesson(NamedTuple):
    """What a task learned from records Kafka did not take."""

    #: another attempt at the same cycle may succeed
    retry: bool
    #: topics whose rules to read again (Kafka refused records the checks let through)
    topics: frozenset[str]


def learn_failure(plan: Plan, failed: Undelivered, made: Provenance) -> Lesson:
    """Take Kafka's refusals into ``plan``.

    A batch refused for a record's sake (an error of :data:`~tables.limits.REFUSALS`,
    or any error for a record sent alone while other batches of the same send were
    taken) leads to its record's input when it held one record, and otherwise to
    sending its partition's records one per batch next time. A batch that failed only
    because an earlier one of its partition did (:data:`~tables.limits.AFTERMATH`)
    teaches nothing but is worth another attempt with a new producer."""
    learned, topics, aftermath_only = False, set(), True
    for failure in failed.failures:
        name = type(failure.error).__name__
        if name in AFTERMATH:
            continue
        aftermath_only = False
        alone = failure.tp in plan.isolate
        if name not in REFUSALS and not (alone and failed.delivered > 0):
            continue  # not the records' fault (as far as anyone can tell)
        topics.add(failure.tp[0])
        if len(failure.records) == 1 and (alone or name in REFUSALS):
            reason = kafka_reason(failure.error, *failure.tp)
            if _blame_record(plan, made, failure.records[0], reason):
                learned = True
                continue
        if failure.tp not in plan.isolate:
            plan.isolate.add(failure.tp)
            learned = True
        for out in failure.records:
            learned |= _suspect_record(plan, made, out)
    return Lesson(learned or aftermath_only, frozenset(topics))


def _blame_record(plan: Plan, made: Provenance, out: Output, reason: str) -> bool:
    """Make the input record ``out`` came from a culprit, when it is known."""
    produced = made.made.get(id(out))
    if produced is not None and produced.source is not None:
        return plan.blame(produced.source, reason)
    logged = made.logged.get(id(out))
    if logged is not None:
        writer = made.writers.get(logged)
        if writer is not None:
            return plan.blame(writer, reason)
    return False


def _suspect_record(plan: Plan, made: Provenance, out: Output) -> bool:
    """Mark what made ``out`` for checked application: a pipeline checked already, one
    record at a time."""
    produced = made.made.get(id(out))
    if produced is not None:
        name = produced.pipeline
        if name is None:
            return False
        if name not in plan.suspects:
            return plan.suspect([name])
        if name not in plan.fine:
            plan.fine.add(name)
            return True
        return False
    logged = made.logged.get(id(out))
    if logged is None:
        return False
    table, key = logged
    learned = plan.watch_key(table, key)
    return plan.suspect(made.table_writers.get(table, ())) or learned


def error_name(reason: str) -> str:
    """The Kafka error a refusal's reason names first (``MessageSizeTooLargeError``)."""
    head = reason.split(None, 1)[0] if reason else ""
    return head.rstrip(":") or "unknown"


def fit_dead_letter(letter: Output, max_bytes: int) -> Output:
    """A dead letter its topic takes: one too large for it keeps its headers (the reason,
    shortened if need be, and where the record is in its source topic) and leaves the
    value out, saying so."""
    if record_batch_bytes(letter.key, letter.value, letter.headers) <= max_bytes:
        return letter
    size = len(letter.value or b"")
    note = (
        f"; the value ({size:,} bytes) is left out: the dead-letter topic takes record "
        f"batches of at most {max_bytes:,} bytes"
    ).encode()
    headers = list(letter.headers or ())
    fitted = letter._replace(value=None, headers=headers)
    for index, (name, data) in enumerate(headers):
        if name != ERROR_HEADER:
            continue
        over = (
            record_batch_bytes(
                letter.key, None, [*headers[:index], (name, data + note), *headers[index + 1 :]]
            )
            - max_bytes
        )
        if over > 0:  # cut on a character's boundary
            kept = data[: max(0, len(data) - over - 3)].decode("utf-8", "ignore")
            data = kept.encode() + b"..."
        headers[index] = (name, data + note)
    return fitted
