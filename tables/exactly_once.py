"""Exact state and output for one agent under ``processing_guarantee="exactly_once"``.

faust 0.15's transactions alone do not make an agent's results exact across a crash (all
read in its source):

1. RocksDB is written at once and the changelog only inside the partition's transaction,
   so after a crash the local database holds writes that Kafka aborted.
2. Changelog records wait in a producer buffer that a background task drains, while
   another task commits transactions on a timer: one event's records can straddle two
   transactions, and a transaction can carry records of events whose offsets it does not
   commit, which a restart then processes again.
3. A send to a topic the app does not consume happens outside every transaction.

:class:`ExactlyOnceState` closes these for the tables and output topics of one agent.
Its tables empty each newly assigned active partition before recovery, so local state is
the committed changelog (1). Their changelog records, the agent's output records and the
offset of the event that caused them are collected per event and handed to the
partition's transactional producer in one step, under the lock that faust's commit takes
(2, 3). A restart skips every event at or below the recorded offset: exactly those whose
outputs committed. Under at-least-once everything goes through faust's usual paths.
"""

from __future__ import annotations

import logging
from typing import Any

import faust
from faust.streams import current_event
from rocksdict import WriteBatch

from tables.batch import Output, partition_key
from tables.transactions import in_transaction, transactional_id

logger = logging.getLogger(__name__)


class CommittedStateTable(faust.Table[bytes, Any]):
    """A table kept exact by an :class:`ExactlyOnceState` (raw ``bytes`` keys)."""

    exactly_once: ExactlyOnceState

    async def on_rebalance(
        self,
        assigned: set[Any],
        revoked: set[Any],
        newly_assigned: set[Any],
        generation_id: int = 0,
    ) -> None:
        await super().on_rebalance(assigned, revoked, newly_assigned, generation_id)
        if self.app.in_transaction:
            standbys = self.app.assignor.assigned_standbys()
            topic = self.changelog_topic.get_topic_name()
            for tp in newly_assigned:
                if tp.topic == topic and tp not in standbys:
                    self._empty(tp.partition)

    def _empty(self, partition: int) -> None:
        # faust 0.15 keeps no changelog offset under exactly-once (it files them under the
        # changelog's partitions and looks them up under the source's), so recovery reads
        # the whole changelog anyway: starting from empty costs nothing more.
        store: Any = self.data
        db = store._db_for_partition(partition)
        batch = WriteBatch(raw_mode=True)
        removed = 0
        for key, _ in db.items():
            batch.delete(key)
            removed += 1
        db.write(batch)
        logger.info(
            "%s[%d]: emptied (%d keys) to restore from the changelog", self.name, partition, removed
        )

    def send_changelog(
        self,
        partition: int | None,
        key: Any,
        value: Any,
        key_serializer: Any = None,
        value_serializer: Any = None,
    ) -> Any:
        if not self.app.in_transaction:
            return super().send_changelog(partition, key, value, key_serializer, value_serializer)
        future = self.changelog_topic.as_future_message(
            key=key,
            value=value,
            partition=partition,
            key_serializer=key_serializer or self.key_serializer,
            value_serializer=value_serializer or self.value_serializer,
            eager_partitioning=True,
        )
        self.exactly_once.add(future.message)
        return future


class ExactlyOnceState:
    """The tables and output records of one agent, exact across crashes under exactly-once.

    In the agent, per event: skip it when :meth:`replayed`; change the tables made with
    :meth:`table` (and others through :meth:`write`); queue output with :meth:`send`;
    finally ``await`` :meth:`commit_event`.
    """

    def __init__(
        self, app: faust.App, name: str, *, partitions: int, on_changelog_event: Any = None
    ) -> None:
        self.app = app
        self.partitions = partitions
        self.on_changelog_event = on_changelog_event
        self._pending: list[Output] = []
        #: source partition -> the offset before which every event's results have been
        #: handed to the partition's transactional producer (this run)
        self._progress: dict[Any, int] = {}
        self.offsets = self.table(f"{name}_offsets", help=f"{name}: last source offset applied")
        revoked: Any = app.on_partitions_revoked
        revoked.connect(self._on_revoked)

    def table(self, name: str, **options: Any) -> Any:
        """Declare a table whose writes are part of this state."""
        if self.on_changelog_event is not None:
            options["on_changelog_event"] = self.on_changelog_event(name)
        table = CommittedStateTable(
            self.app,
            name=name,
            key_type=bytes,
            partitions=self.partitions,
            beacon=self.app.tables.beacon,
            **options,
        )
        table.exactly_once = self
        return self.app.tables.add(table)

    def replayed(self, event: Any) -> bool:
        """Whether this event's outputs have already committed (exactly-once only)."""
        if not self.app.in_transaction:
            return False
        applied = self.offsets.get(self._offset_key(event))
        if applied is None or event.message.offset > int(applied):
            return False
        self._advance(event.message.tp, event.message.offset)
        return True

    def progress(self, tp: Any) -> int | None:
        """The offset of ``tp`` before which every event's results are in the partition's
        transactional producer (exactly-once): from this run, else from the restored
        record of the last event applied; None if neither is known."""
        done = self._progress.get(tp)
        if done is not None:
            return done
        stored = self.offsets.data._db_for_partition(tp.partition).get(
            partition_key(tp.topic, tp.partition)
        )
        if stored is None:
            return None
        return int(self.offsets.data._decode_value(stored)) + 1

    def _advance(self, tp: Any, offset: int) -> None:
        if offset + 1 > self._progress.get(tp, -1):
            self._progress[tp] = offset + 1

    def write(self, table: Any, key: Any, value: Any) -> None:
        """Set a key of a table declared elsewhere, its changelog record part of this event."""
        if not self.app.in_transaction:
            table[key] = value
            return
        event = current_event()
        assert event is not None, "write() runs inside the stream iteration"
        table.data[key] = value
        future = table.changelog_topic.as_future_message(
            key=key,
            value=value,
            partition=event.message.partition,
            key_serializer=table.key_serializer,
            value_serializer=table.value_serializer,
            eager_partitioning=True,
        )
        self.add(future.message)

    def send(self, topic: Any, key: bytes | None, value: bytes | None) -> None:
        """Queue an output record (raw bytes) of the current event."""
        self._pending.append(Output(topic.get_topic_name(), key, value, None))

    def add(self, message: Any) -> None:
        """Queue a faust PendingMessage (serialized, partition chosen) of the current event."""
        topic = message.channel.get_topic_name()
        self._pending.append(Output(topic, message.key, message.value, message.partition))

    async def commit_event(self, event: Any) -> None:
        """Record the event as applied and publish everything it produced, as one unit."""
        if self.app.in_transaction:
            self.offsets[self._offset_key(event)] = event.message.offset
        records, self._pending = self._pending, []
        producer: Any = self.app.producer
        if not self.app.in_transaction:
            for record in records:
                await producer.send(
                    record.topic, record.key, record.value, record.partition, None, None
                )
            return
        message = event.message
        tid = transactional_id(self.app, message.topic, message.partition)
        # Under the lock faust's commit takes for this transaction: no commit can fall
        # between these records, and those of a later event cannot join an earlier commit.
        async with in_transaction(producer, tid) as transaction:
            for record in records:
                await transaction.send(
                    record.topic, record.value, key=record.key, partition=record.partition
                )
            self._advance(message.tp, message.offset)

    async def _on_revoked(self, sender: Any, revoked: Any, **kwargs: Any) -> None:
        """Partitions revoked: their progress is read again from the table next time (what
        this run handed over may have been aborted, or another worker gone further)."""
        for tp in revoked:
            self._progress.pop(tp, None)

    @staticmethod
    def _offset_key(event: Any) -> bytes:
        return partition_key(event.message.topic, event.message.partition)
