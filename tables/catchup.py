"""How many records of each source partition a fetch hands the engine while the backlog
of a rebalance is worked off.

A rebalance pauses every partition of the group (aiokafka speaks only the eager
protocol), and the records that arrive meanwhile wait. Taken in one cycle, they hold
the partitions' commits back for as long as that cycle takes, on top of the pause: in
the chaos scenario ``scale_*``, first cycles of 3,500-13,600 records that took 0.2-0.8 s,
several times the cycles before the rebalance. So after a rebalance of a member
that ran cycles before it, each fetch hands out at most :data:`FACTOR` times the
records per source partition of its usual cycles at first, and :data:`GROWTH` times as
many at each further fetch (the rest stays in the consumer's buffer for the next cycle,
nothing is fetched twice), until a fetch leaves nothing behind or :data:`MAX_S` have
passed. The first commit comes after a cycle about twice the usual size, and no later
cycle takes more than about half of what the pause left.

A member's first assignment is not capped: it has no usual cycle yet, and a worker that
starts on a long backlog wants the largest cycles.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

logger = logging.getLogger(__name__)

#: A catch-up cycle takes at most this many times the usual records per partition.
FACTOR = 2.0
#: ... and never fewer than this many per partition.
FLOOR = 100
#: Each capped fetch of a catch-up may hand out this many times the one before: the
#: cycles grow back to their usual size without one that takes all that is left.
GROWTH = 2
#: A catch-up ends at the latest this long after the assignment.
MAX_S = 3.0
#: Weight of the latest cycle in the usual records per partition.
SMOOTHING = 0.2


class CatchUp:
    """The usual size of a cycle, and whether fetches are capped now.

    The engine reports its cycles (:meth:`observe`) and assignments (:meth:`begin`);
    the consumer asks for the cap before each fetch (:meth:`cap`) and says afterwards
    whether it left records behind (:meth:`fetched`)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        #: records per fetched source partition of a cycle outside a catch-up, smoothed
        self.usual: float | None = None
        self._until: float | None = None
        self._began = 0.0
        #: catch-ups begun, and the fetches the current or last one capped
        self.begun = 0
        self.capped_fetches = 0

    def observe(self, records: int, partitions: int) -> None:
        """A cycle took ``records`` records of ``partitions`` source partitions."""
        if partitions <= 0 or self.active():
            return
        per = records / partitions
        self.usual = per if self.usual is None else self.usual + SMOOTHING * (per - self.usual)

    def begin(self) -> None:
        """An assignment came: cap the fetches if this member ran cycles before it."""
        if self.usual is None:
            return
        self._began = self.clock()
        self._until = self._began + MAX_S
        self.begun += 1
        self.capped_fetches = 0
        logger.info(
            "after the assignment, the first fetch hands out at most %d records per source "
            "partition (%.0f per cycle before it) and each further one %d times as many, "
            "until the backlog is worked off, for at most %.0f s",
            self._first_cap(self.usual),
            self.usual,
            GROWTH,
            MAX_S,
        )

    @staticmethod
    def _first_cap(usual: float) -> int:
        return max(FLOOR, int(FACTOR * usual))

    def active(self) -> bool:
        if self._until is not None and self.clock() >= self._until:
            self._end("its time was up")
        return self._until is not None

    def cap(self) -> int | None:
        """The most records of one source partition a fetch may hand out now (None: as
        many as the consumer has)."""
        if not self.active() or self.usual is None:
            return None
        return int(self._first_cap(self.usual) * GROWTH**self.capped_fetches)

    def fetched(self, left_behind: bool) -> None:
        """A capped fetch left records of some source partition behind, or none."""
        self.capped_fetches += 1
        if not left_behind and self._until is not None:
            self._end("the backlog was worked off")

    def _end(self, why: str) -> None:
        self._until = None
        logger.info(
            "capped fetches after the assignment ended: %s, after %d fetches in %.2f s",
            why,
            self.capped_fetches,
            self.clock() - self._began,
        )
