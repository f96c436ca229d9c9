"""How far a consumer group has got through preloaded records, polled over time."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from bench.kafka import OffsetWatch, totals


@dataclass
class Progress:
    """Processed source records over time, as (seconds since the watch began, records)."""

    total: int
    series: list[tuple[float, float]] = field(default_factory=list)
    #: The source topic's committed records over time (its first stage's progress).
    source_series: list[tuple[float, int]] = field(default_factory=list)
    finished: bool = False
    elapsed_s: float = 0.0
    #: The group's committed records and the topics' records at the last poll.
    committed: dict[str, int] = field(default_factory=dict)
    ends: dict[str, int] = field(default_factory=dict)

    @property
    def done(self) -> float:
        return self.series[-1][1] if self.series else 0.0


def processed(
    committed: dict[str, int], ends: dict[str, int], source: str, downstream: list[str]
) -> float:
    """Source records whose work is complete, estimated from committed offsets.

    A source record is only half done when its repartition records still wait in a
    downstream topic; the committed share of each downstream topic scales the count.
    """
    done = float(committed.get(source, 0))
    for topic in downstream:
        end = ends.get(topic, 0)
        if end > 0:
            done *= min(1.0, committed.get(topic, 0) / end)
    return done


async def watch_group(
    bootstrap: str,
    group: str,
    source: str,
    downstream: list[str],
    total: int,
    max_s: float,
    interval: float = 0.5,
    alive: Callable[[], bool] = lambda: True,
    startup_s: float = 180.0,
    topic_groups: dict[str, str] | None = None,
    inputs: tuple[str, ...] = (),
) -> Progress:
    """Poll the group's committed offsets until all ``total`` records of ``source`` are
    committed and the group has consumed every record of the ``downstream`` topics, or
    ``max_s`` seconds passed since the group first committed progress (which may take up
    to ``startup_s``). ``topic_groups``: topics that another group commits. ``inputs``:
    other source topics (the payments of the inventory): they must be consumed too before
    the run is finished, but do not scale the count of processed ``source`` records.

    End offsets are last stable offsets; a downstream partition whose committed offset
    stops short of its end only by transaction markers counts as consumed
    (:meth:`OffsetWatch.caught_up`), so a run under exactly-once finishes too.
    """
    progress = Progress(total)
    started = time.monotonic()
    first_progress: float | None = None
    async with OffsetWatch(bootstrap, group, topic_groups) as watch:
        while True:
            offsets = await watch.committed_offsets()
            end_offsets = await watch.end_offsets([source, *downstream, *inputs])
            committed, ends = totals(offsets), totals(end_offsets)
            now = time.monotonic()
            done = processed(committed, ends, source, downstream)
            progress.committed, progress.ends = committed, ends
            progress.series.append((now - started, done))
            progress.source_series.append((now - started, committed.get(source, 0)))
            if done > 0 and first_progress is None:
                first_progress = now
            if committed.get(source, 0) >= total and await watch.caught_up(offsets, end_offsets):
                progress.finished = True
                progress.series[-1] = (now - started, float(total))
                break
            if first_progress is not None and now - first_progress > max_s:
                break
            if first_progress is None and now - started > startup_s:
                break
            if not alive():
                raise RuntimeError(f"the {group} worker exited during the run")
            await asyncio.sleep(interval)
    progress.elapsed_s = time.monotonic() - started
    return progress
