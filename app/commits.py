"""Two fixes to faust's bookkeeping of the offsets it may commit.

1. The commit of a rebalance covers what the revoked partitions' streams have done.
   When partitions are revoked, faust's consumer first forgets its bookkeeping of them
   (the acked offsets, the committed offsets) and only then runs the app's handler,
   which waits for the streams to ack their events and commits. By then the commit has
   nothing to commit for the revoked partitions (all of them, in an eager rebalance):
   everything the streams did since the last timed commit (every 2.8 s) is done again
   by the partitions' next owners. Under at_least_once that is over-counted at every
   rebalance, a clean stop of another worker included. :func:`commit_before_revoke`
   runs the same steps with the bookkeeping forgotten after the handler has committed.

2. The committable offset is the end of the first run of consecutive acked offsets.
   faust adds the offsets of a partition's gaps (offsets it saw no record for) to the
   acked ones, and an offset can be in both: the run then looks broken at the
   duplicate, and the commit stops short of what was acked. Short commits are what a
   rebalance's next owner processes again. :func:`dedupe_acked` computes the same
   offset with each offset counted once.
"""

from __future__ import annotations

from typing import Any

from faust.transport.consumer import CONSUMER_PARTITIONS_REVOKED
from faust.utils.functional import consecutive_numbers


def commit_before_revoke(consumer: Any) -> None:
    """Patch one faust consumer instance (idempotent)."""
    if getattr(consumer, "_streamstate_commit_before_revoke", False):
        return

    async def on_partitions_revoked(revoked: set[Any]) -> None:
        consumer.diag.set_flag(CONSUMER_PARTITIONS_REVOKED)
        try:
            if consumer._active_partitions is not None:
                consumer._active_partitions.difference_update(revoked)
            consumer._paused_partitions.difference_update(revoked)
            # The app's handler: waits for the streams, then commits what they acked.
            await consumer._on_partitions_revoked(revoked)
            for tp in revoked:
                consumer._gap.pop(tp, None)
                consumer._acked.pop(tp, None)
                consumer._acked_index.pop(tp, None)
                consumer._read_offset.pop(tp, None)
                consumer._committed_offset.pop(tp, None)
        finally:
            consumer.diag.unset_flag(CONSUMER_PARTITIONS_REVOKED)

    consumer.on_partitions_revoked = on_partitions_revoked
    consumer._streamstate_commit_before_revoke = True


def dedupe_acked(consumer: Any) -> None:
    """Patch one faust consumer instance's ``_new_offset`` (idempotent)."""
    if getattr(consumer, "_streamstate_dedupe_acked", False):
        return

    def new_offset(tp: Any) -> int | None:
        acked: list[int] = consumer._acked[tp]
        if not acked:
            return None
        max_offset = max(acked)
        gap = consumer._gap[tp]
        if gap:
            runs = sorted(gap.overlap(0, max_offset), key=lambda run: run.begin)
            if runs:
                offsets = [n for run in runs for n in range(run.begin, run.end)]
                acked.extend(offsets)
                gap.chop(0, max(offsets[-1], max_offset + 1))
        acked[:] = sorted(set(acked))
        committed = consumer._committed_offset[tp]
        if committed and acked[0] - committed > 1:
            return None  # the offsets right after the committed one are not acked yet
        run = list(next(consecutive_numbers(acked)))
        del acked[: len(run)]
        consumer._acked_index[tp].difference_update(run)
        return run[-1] + 1

    consumer._new_offset = new_offset
    consumer._streamstate_dedupe_acked = True
