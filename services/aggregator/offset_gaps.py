"""Finding results that faust will never deliver again, and asking the broker for them again.

Measured (faust-streaming 0.15.3, aiokafka 0.14, on Tansu, though the loss is faust's own and
not the broker's; ``tests/integration/test_aggregator.py`` under CPU load): after a restart, the
new worker's first offsets of a results partition never reached the agent. In one run 93 offsets
(1349-1441) of one partition were missing: faust's committed offset stayed at 1349 while every
offset from 1442 on was acked, so faust could never commit again, and the lines in between were
never counted (the batch could not complete).

How faust loses them: its Cython stream iterator drops a message it pulls while the app's flow
control is suspended or the message was fetched in an older consumer generation (both happen
while a rebalance and the table recovery run), without tracking or acking it. faust relies on
the seek to the committed offsets at the end of recovery to fetch such messages again, but its
fetch loop drops any message below the last offset it read, and that loop can still be handing
out the batch it fetched before the seek; so the copies fetched again are dropped as well.

Nothing in faust notices: its committed offset waits forever for offsets that will not come (the
stall watchdog then restarts the worker, which loses nothing but takes a rebalance). This module
notices it sooner and more cheaply. For each owned results partition, ``unaccounted`` finds the
offsets from the committed one up to the lowest acked one (or up to the high-water mark when
nothing is acked) that the agent does not hold either. ``GapRewinder`` reports a partition when
that same range has stood for ``after_s``; the rewind timer then seeks the partition back to its
committed offset (``timers.py``, through ``faust_adapter.ResultsPartitions.rewind``). The results
fetched again that were already counted are dropped by the bitmap, so a rewind is harmless even
when it was not needed.

Kept free of faust so the unit tests drive it with plain values and a fake clock.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

K = TypeVar("K", bound=Hashable)
Range = tuple[int, int]


@dataclass(frozen=True)
class PartitionOffsets:
    """faust's bookkeeping for one partition, copied out of its consumer."""

    committed: int | None  # the next offset to process (None: nothing committed yet)
    acked: Sequence[int]  # acked, not committed yet
    gap_starts: Sequence[int]  # faust's recorded broker offset gaps (none: faust_adapter.Consumer._add_gap)
    highwater: int | None  # the last fetch's high-water mark (None: no fetch answer yet)
    in_flight: Sequence[int]  # delivered to the agent, not acked yet


def lowest_acked(acked: Iterable[int], gap_starts: Iterable[int]) -> int | None:
    """The lowest offset faust counts as acked (its recorded broker gaps included); None: none."""
    return min([*acked, *gap_starts], default=None)


def unaccounted(offsets: PartitionOffsets) -> Range | None:
    """The offsets ``[committed, head)`` that nobody holds: not acked and not in flight."""
    if offsets.committed is None:  # nothing to rewind to
        return None
    head = lowest_acked(offsets.acked, offsets.gap_starts)
    if head is None:
        head = offsets.highwater
    if head is None or head <= offsets.committed:
        return None
    if any(offsets.committed <= offset < head for offset in offsets.in_flight):
        return None  # still on its way through the agent
    return (offsets.committed, head)


def describe(offsets: PartitionOffsets) -> dict[str, Any]:
    """A short account of one partition's offsets for the log."""
    return {
        "committed": offsets.committed,
        "highwater": offsets.highwater,
        "acked_not_committed": len(offsets.acked),
        "lowest_acked": min(offsets.acked, default=None),
        "in_flight": len(offsets.in_flight),
        "unaccounted": unaccounted(offsets),
    }


class GapRewinder(Generic[K]):
    """Reports a partition once the same unaccounted range has stood for ``after_s``."""

    def __init__(self, after_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.after_s = after_s
        self._clock = clock
        self._seen: dict[K, tuple[Range, float]] = {}

    def due(self, ranges: Mapping[K, Range | None]) -> list[K]:
        """The partitions to rewind now; each is reported again only after another ``after_s``."""
        now = self._clock()
        due: list[K] = []
        for key in set(self._seen) - set(ranges):
            del self._seen[key]  # no longer owned
        for key, gap in ranges.items():
            seen = self._seen.get(key)
            if gap is None:
                self._seen.pop(key, None)
            elif seen is None or seen[0] != gap:
                self._seen[key] = (gap, now)
            elif now - seen[1] >= self.after_s:
                due.append(key)
                self._seen[key] = (gap, now)
        return due
