"""Replay dead letters to their source topics, each at most once (:mod:`api.console.replay_log`).

A dead letter goes back to the topic its ``source-topic`` header names, to the partition
its ``source-partition`` header names, with its original key and value and a
``replayed-from`` header naming the dead letter. Where the produce endpoint validates the
source topic, the replay validates the record the same way first: a record that is still
invalid goes back to its dead-letter topic (with the new reason, its source headers and
``replayed-from``), never to the source topic, so it changes no table.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from api.console.dead_letters import REPLAYED_FROM_HEADER, DeadLetter, coordinates, fetch
from api.console.replay_log import ReplayLog
from api.errors import BadRequest, KafkaUnavailable, NotFound, QueryError
from api.records import check_raw
from core.values import InvalidEvent
from tables.pipeline import ERROR_HEADER, FAILED_PIPELINE_HEADER, SourceSpec

SOURCE_HEADERS = ("source-topic", "source-partition", "source-offset")


class AlreadyReplayed(QueryError):
    """Some dead letters asked for were replayed (or claimed) before: nothing was done."""

    status = 409


class AppliedElsewhere(QueryError):
    """A dead letter of a step that raised in one pipeline, while others reading its topic
    applied the record: a replay to the topic would apply it to them again."""

    status = 409


@dataclass(frozen=True)
class Wanted:
    """A dead letter to replay."""

    topic: str
    partition: int
    offset: int

    @property
    def name(self) -> str:
        return coordinates(self.topic, self.partition, self.offset)


def validate(
    spec: SourceSpec | None, key: bytes | None, value: bytes | None, max_bytes: int
) -> tuple[bytes | None, str | None]:
    """Check a record for a source topic as the stream would (``spec``, its declared
    value type): (the key to send, None) when it passes, else (key, the reason)."""
    try:
        return check_raw(spec, key, value, max_bytes).key, None
    except InvalidEvent as error:
        return key, error.reason


class Replayer:
    """Replays dead letters of the loaded pipelines' dead-letter topics."""

    def __init__(
        self,
        bootstrap: str,
        log: ReplayLog,
        sources: Mapping[str, str],
        specs: Mapping[str, SourceSpec | None],
        partitions: int,
        max_event_bytes: int,
        own_url: str,
        readers: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        self.bootstrap = bootstrap
        self.log = log
        #: dead-letter topic -> its source topic
        self.sources = dict(sources)
        #: source topic -> how its records are checked
        self.specs = dict(specs)
        self.partitions = partitions
        self.max_event_bytes = max_event_bytes
        self.own_url = own_url
        #: source topic -> the pipelines that read it
        self.readers = {topic: tuple(names) for topic, names in (readers or {}).items()}

    def check(self, wanted: Sequence[Wanted]) -> None:
        """400 or 404 for a request that names no dead letter of this worker's topics."""
        names = [w.name for w in wanted]
        if twice := sorted({n for n in names if names.count(n) > 1}):
            raise BadRequest(f"dead letters named twice: {', '.join(twice)}")
        for w in wanted:
            if w.topic not in self.sources:
                known = ", ".join(sorted(self.sources))
                raise NotFound(f"{w.topic!r} is not a dead-letter topic of this worker: {known}")
            if not 0 <= w.partition < self.partitions:
                raise BadRequest(f"{w.name}: partition must lie in [0, {self.partitions})")

    def status(self, name: str) -> dict[str, Any] | None:
        """What the replay log says of a dead letter (None: never replayed)."""
        return self.log.states.get(name)

    async def replay(
        self, wanted: Sequence[Wanted], apply_to_all: bool = False
    ) -> list[dict[str, Any]]:
        """Replay each dead letter; 409 (nothing done) if any was replayed before, or if
        one is a record a step raised on in one pipeline while other pipelines applied it
        (unless ``apply_to_all``: they apply it again)."""
        self.check(wanted)
        try:
            await self.log.caught_up()
        except Exception as error:
            raise KafkaUnavailable(f"the replay log cannot be read: {error!r}") from None
        taken = [(w, self.status(w.name)) for w in wanted if self.status(w.name) is not None]
        if taken:
            refused = [{**_coordinates(w), "replay": entry} for w, entry in taken]
            raise AlreadyReplayed(
                f"{len(taken)} of {len(wanted)} dead letters were replayed before; "
                "nothing was replayed",
                extra={"refused": refused},
            )
        found = await fetch(self.bootstrap, [(w.topic, w.partition, w.offset) for w in wanted])
        if missing := [w.name for w in wanted if (w.topic, w.partition, w.offset) not in found]:
            raise NotFound(f"no dead letter at {', '.join(missing)}; nothing was replayed")
        letters = [found[(w.topic, w.partition, w.offset)] for w in wanted]
        for w, letter in zip(wanted, letters, strict=True):
            named = letter.header("source-topic")
            if named is not None and named.decode("utf-8", "replace") != self.sources[w.topic]:
                raise BadRequest(
                    f"{w.name} names source topic {named.decode('utf-8', 'replace')!r}, not "
                    f"{self.sources[w.topic]!r}; nothing was replayed"
                )
        if not apply_to_all:
            self._check_not_applied(wanted, letters)
        return [await self._one(w, letter) for w, letter in zip(wanted, letters, strict=True)]

    def _check_not_applied(self, wanted: Sequence[Wanted], letters: Sequence[DeadLetter]) -> None:
        """409 when a dead letter's record was applied by pipelines other than the one
        that failed on it: a replay to the source topic reaches every pipeline reading it."""
        for w, letter in zip(wanted, letters, strict=True):
            failed = letter.header(FAILED_PIPELINE_HEADER)
            if failed is None:  # refused before any pipeline applied it
                continue
            pipeline = failed.decode("utf-8", "replace")
            source = self.sources[w.topic]
            others = [name for name in self.readers.get(source, ()) if name != pipeline]
            if others:
                raise AppliedElsewhere(
                    f"{w.name}: only pipeline {pipeline} failed on this record; "
                    f"{', '.join(others)} applied it, and a replay to {source} would apply "
                    'it to them again. Nothing was replayed; send "apply_to_all": true to '
                    "replay it all the same."
                )

    async def _one(self, wanted: Wanted, letter: DeadLetter) -> dict[str, Any]:
        claim = await self.log.claim(wanted.name, self.own_url)
        if claim is None:
            entry = self.status(wanted.name)
            detail = f"replayed by {(entry or {}).get('by')} a moment before"
            return {**_coordinates(wanted), "status": "refused", "to": None, "detail": detail}
        try:
            outcome = await self._send(wanted, letter)
        except Exception as error:
            failed = {"status": "failed", "detail": repr(error)}
            await self.log.record(wanted.name, claim, self.own_url, failed)
            raise KafkaUnavailable(
                f"{wanted.name} may not have been replayed ({error!r}); it stays claimed"
            ) from None
        await self.log.record(wanted.name, claim, self.own_url, outcome)
        return {**_coordinates(wanted), "detail": None, **outcome}

    async def _send(self, wanted: Wanted, letter: DeadLetter) -> dict[str, Any]:
        source = self.sources[wanted.topic]
        key, problem = validate(
            self.specs.get(source), letter.key, letter.value, self.max_event_bytes
        )
        replayed_from = (REPLAYED_FROM_HEADER, wanted.name.encode())
        if problem is not None:
            headers = [(ERROR_HEADER, f"replay refused: {problem}"[:1000].encode())]
            headers += [(k, v) for k, v in letter.headers if k in SOURCE_HEADERS]
            headers.append(replayed_from)
            where = await self.log.send(wanted.topic, key, letter.value, None, headers)
            return {"status": "dead-lettered", "to": where, "detail": problem}
        partition = _int(letter.header("source-partition"))
        if partition is not None and not 0 <= partition < self.partitions:
            partition = None
        where = await self.log.send(source, key, letter.value, partition, [replayed_from])
        return {"status": "replayed", "to": where}


def _coordinates(wanted: Wanted) -> dict[str, Any]:
    return {"topic": wanted.topic, "partition": wanted.partition, "offset": wanted.offset}


def _int(raw: bytes | None) -> int | None:
    try:
        return None if raw is None else int(raw)
    except ValueError:
        return None
