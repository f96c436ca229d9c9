"""No fetched record is dropped without the consumer going back for it.

faust hands fetched records to the streams in ``Consumer.getmany``, and drops some on
the way: those of a partition that is not active at that moment, the rest of a fetch
when the flow stops or the generation changes, and (in the stream) every record that
arrives while the app's flow control is suspended, which the stream acks unprocessed.
faust counts on a later seek to the committed offsets to fetch them again, but the fetch
position has already moved past them, and when the flow resumes after that seek (the end
of a recovery resumes partitions, seeks, and only then resumes flow control), the records
fetched in between are skipped for good while the records after them are processed: a
per-event agent acks past the hole, a batched agent (``tables/batch.py``) commits past it.

:func:`seek_back_on_skip` replaces ``getmany`` on one consumer: a record is handed out
only while it would be processed; for every partition with records that were not handed
out, the consumer seeks back to the first of them, so the next fetch returns them again.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

logger = logging.getLogger(__name__)


def seek_back_on_skip(consumer: Any) -> None:
    """Patch one faust consumer instance (idempotent)."""
    if getattr(consumer, "_streamstate_seek_back", False):
        return
    app = consumer.app

    def deliverable(tp: Any, active: set[Any] | None, generation_id: int) -> bool:
        return (
            consumer.flow_active
            and app.flow_control.is_active()
            and app.consumer_generation_id == generation_id
            and (active is None or tp in active or tp in consumer._buffered_partitions)
        )

    # faust calls getmany(timeout=...) by keyword.
    async def getmany(timeout: float) -> AsyncIterator[tuple[Any, Any]]:  # noqa: ASYNC109
        records, active_now = await consumer._wait_next_records(timeout)
        if records is None or consumer.should_stop:
            return
        generation_id = app.consumer_generation_id
        active = None if active_now is None else set(active_now)
        #: per partition, the offset of the first record not handed out
        held_back: dict[Any, int] = {}
        for tp, record in consumer.scheduler.iterate(records):
            if tp in held_back:
                continue
            if not deliverable(tp, active, generation_id):
                held_back[tp] = record.offset
                continue
            app.monitor.track_tp_end_offset(tp, consumer.highwater(tp))
            yield tp, consumer._to_message(tp, record)
        for tp, offset in held_back.items():
            if app.consumer_generation_id != generation_id or tp not in consumer.assignment():
                continue  # a rebalance seeks every partition to its committed offset
            await consumer.seek(tp, offset)
            logger.info(
                "%s[%d]: records from offset %d not handed out (flow suspended or "
                "partition inactive); fetching them again",
                tp.topic,
                tp.partition,
                offset,
            )

    consumer.getmany = getmany
    consumer._streamstate_seek_back = True
