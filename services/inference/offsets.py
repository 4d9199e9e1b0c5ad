"""Which offset each partition may commit when requests finish out of order.

A partition commits up to its lowest offset still in flight: everything below it is finished.
With nothing in flight it commits the offset after the last one started. The lines past that
offset already finished are counted too (``done_past``: committed as the offset's metadata, so the
dispatcher does not count them as waiting). Pure bookkeeping, no I/O.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Generic, TypeVar

from shared.topics import CommitProgress

P = TypeVar("P", bound=Hashable)


class OffsetTracker(Generic[P]):
    """In-flight offsets per partition, and what is committable.

    ``start`` returns an epoch; ``finish`` with a stale epoch (the partition was revoked and
    forgotten meanwhile) is ignored, so late work never moves a new owner's offsets.
    """

    def __init__(self) -> None:
        self._in_flight: dict[P, set[int]] = {}
        self._next: dict[P, int] = {}
        self._committed: dict[P, int] = {}
        self._reported: dict[P, int] = {}  # done_past as last committed
        self._epoch: dict[P, int] = {}

    def start(self, partition: P, offset: int) -> int:
        self._in_flight.setdefault(partition, set()).add(offset)
        self._next[partition] = max(self._next.get(partition, 0), offset + 1)
        return self._epoch.setdefault(partition, 0)

    def finish(self, partition: P, offset: int, epoch: int) -> None:
        if self._epoch.get(partition) != epoch:
            return
        self._in_flight.get(partition, set()).discard(offset)

    def in_flight(self, partition: P | None = None) -> int:
        if partition is not None:
            return len(self._in_flight.get(partition, ()))
        return sum(len(offsets) for offsets in self._in_flight.values())

    def committable(self, partition: P) -> int | None:
        """The offset to commit for a partition (the next one to read), or None if none started."""
        if partition not in self._next:
            return None
        pending = self._in_flight.get(partition)
        return min(pending) if pending else self._next[partition]

    def done_past(self, partition: P) -> int:
        """Lines started past the committable offset that are finished (every offset from it to
        the last one started was started: a partition is read in order)."""
        pending = self._in_flight.get(partition)
        if not pending:
            return 0
        return self._next[partition] - min(pending) - len(pending)

    def to_commit(self, partitions: Iterable[P] | None = None) -> dict[P, tuple[int, CommitProgress]]:
        """The offset to commit and its ``CommitProgress`` (the lines done past it, the offset
        read to) for the partitions whose committable offset moved past the last commit, or whose
        count of lines done past it changed."""
        chosen = self._next.keys() if partitions is None else partitions
        offsets: dict[P, tuple[int, CommitProgress]] = {}
        for partition in list(chosen):
            offset = self.committable(partition)
            if offset is None:
                continue
            done = self.done_past(partition)
            last = self._committed.get(partition, -1)
            if offset > last or (offset == last and done != self._reported.get(partition, 0)):
                offsets[partition] = (offset, CommitProgress(done, self._next[partition]))
        return offsets

    def committed(self, offsets: dict[P, tuple[int, CommitProgress]]) -> None:
        for partition, (offset, progress) in offsets.items():
            if offset >= self._committed.get(partition, -1):
                self._committed[partition] = offset
                self._reported[partition] = progress.done_past

    def forget(self, partitions: Iterable[P]) -> None:
        """Drop all bookkeeping of partitions no longer owned; bump their epochs."""
        for partition in partitions:
            self._in_flight.pop(partition, None)
            self._next.pop(partition, None)
            self._committed.pop(partition, None)
            self._reported.pop(partition, None)
            self._epoch[partition] = self._epoch.get(partition, 0) + 1
