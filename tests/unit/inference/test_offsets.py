"""OffsetTracker: commit up to the lowest offset still in flight, whatever order work ends in."""

from services.inference.offsets import OffsetTracker
from shared.topics import CommitProgress

P0, P1 = ("t", 0), ("t", 1)


def test_nothing_started_commits_nothing() -> None:
    tracker: OffsetTracker[tuple[str, int]] = OffsetTracker()
    assert tracker.committable(P0) is None
    assert tracker.to_commit() == {}


def test_out_of_order_completion_commits_only_the_contiguous_prefix() -> None:
    tracker: OffsetTracker[tuple[str, int]] = OffsetTracker()
    epochs = {offset: tracker.start(P0, offset) for offset in (10, 11, 12, 13)}
    tracker.finish(P0, 12, epochs[12])
    tracker.finish(P0, 13, epochs[13])
    assert tracker.committable(P0) == 10  # 10 still runs: nothing past it is safe
    assert tracker.done_past(P0) == 2  # but 12 and 13 are done: the dispatcher is told so
    tracker.finish(P0, 10, epochs[10])
    assert tracker.committable(P0) == 11
    tracker.finish(P0, 11, epochs[11])
    assert tracker.committable(P0) == 14  # all done: the next offset to read


def test_partitions_are_independent() -> None:
    tracker: OffsetTracker[tuple[str, int]] = OffsetTracker()
    a = tracker.start(P0, 0)
    tracker.start(P1, 5)
    tracker.finish(P0, 0, a)
    assert tracker.to_commit() == {P0: (1, CommitProgress(0, 1)), P1: (5, CommitProgress(0, 6))}
    assert tracker.in_flight() == 1 and tracker.in_flight(P1) == 1


def test_to_commit_skips_offsets_already_committed() -> None:
    tracker: OffsetTracker[tuple[str, int]] = OffsetTracker()
    tracker.finish(P0, 0, tracker.start(P0, 0))
    offsets = tracker.to_commit()
    assert offsets == {P0: (1, CommitProgress(0, 1))}
    tracker.committed(offsets)
    assert tracker.to_commit() == {}
    tracker.start(P0, 1)
    assert tracker.to_commit() == {}  # 1 in flight: committable is still 1
    assert tracker.to_commit([P1]) == {}


def test_forget_drops_partition_and_ignores_late_finishes() -> None:
    tracker: OffsetTracker[tuple[str, int]] = OffsetTracker()
    stale = tracker.start(P0, 7)
    tracker.forget([P0])
    assert tracker.committable(P0) is None
    fresh = tracker.start(P0, 7)  # the partition comes back; 7 is redelivered
    assert fresh != stale
    tracker.finish(P0, 7, stale)  # the old run ends late: must not count
    assert tracker.committable(P0) == 7
    tracker.finish(P0, 7, fresh)
    assert tracker.committable(P0) == 8


def test_lines_done_past_the_commit_are_committed_as_they_change() -> None:
    tracker: OffsetTracker[tuple[str, int]] = OffsetTracker()
    epochs = {offset: tracker.start(P0, offset) for offset in range(5)}
    tracker.finish(P0, 3, epochs[3])
    offsets = tracker.to_commit()
    assert offsets == {P0: (0, CommitProgress(1, 5))}  # 0 runs; 3 is done past it; 0-4 read
    tracker.committed(offsets)
    assert tracker.to_commit() == {}  # nothing changed since
    tracker.finish(P0, 1, epochs[1])
    assert tracker.to_commit() == {P0: (0, CommitProgress(2, 5))}  # one more done past the same offset
    tracker.finish(P0, 0, epochs[0])
    assert tracker.to_commit() == {P0: (2, CommitProgress(1, 5))}  # 0 and 1 done: 2 runs, 3 done past it
