"""Finding results offsets nobody holds, and when to fetch them again (fake clock)."""

from __future__ import annotations

from services.aggregator.offset_gaps import GapRewinder, PartitionOffsets, unaccounted
from tests.support.fakes import FakeClock


def offsets(
    committed: int | None = 100,
    acked: tuple[int, ...] = (),
    gap_starts: tuple[int, ...] = (),
    highwater: int | None = 100,
    in_flight: tuple[int, ...] = (),
) -> PartitionOffsets:
    return PartitionOffsets(committed, acked, gap_starts, highwater, in_flight)


def test_an_idle_partition_with_everything_committed_holds_nothing_unaccounted() -> None:
    assert unaccounted(offsets(committed=100, highwater=100)) is None


def test_acked_results_waiting_for_the_next_commit_are_accounted_for() -> None:
    assert unaccounted(offsets(committed=100, acked=(100, 101, 102), highwater=103)) is None


def test_a_chunk_still_in_the_agent_is_accounted_for() -> None:
    # Delivered, being stored: not acked yet, but on its way.
    assert unaccounted(offsets(committed=100, highwater=150, in_flight=tuple(range(100, 150)))) is None


def test_offsets_below_the_lowest_acked_that_nobody_holds_are_reported() -> None:
    # The restart seen in the tests: 1349-1441 dropped, everything from 1442 acked.
    lost = offsets(committed=1349, acked=tuple(range(1442, 2250)), highwater=2250)
    assert unaccounted(lost) == (1349, 1442)


def test_a_single_dropped_offset_right_at_the_committed_one_is_reported() -> None:
    assert unaccounted(offsets(committed=100, acked=(101, 102), highwater=103)) == (100, 101)


def test_results_waiting_with_nothing_acked_or_in_flight_are_reported() -> None:
    assert unaccounted(offsets(committed=100, highwater=130)) == (100, 130)


def test_nothing_is_reported_before_a_commit_or_a_fetch_answer() -> None:
    assert unaccounted(offsets(committed=None, acked=(5, 6), highwater=7)) is None
    assert unaccounted(offsets(committed=100, highwater=None)) is None


def test_a_recorded_broker_gap_counts_as_acked() -> None:
    assert unaccounted(offsets(committed=100, acked=(105,), gap_starts=(100,), highwater=106)) is None


def test_a_range_is_due_once_it_has_stood_for_the_wait_and_then_again_after_another() -> None:
    clock = FakeClock()
    rewinder: GapRewinder[str] = GapRewinder(5.0, clock=clock)
    gap = (1349, 1442)
    assert rewinder.due({"p3": gap, "p1": None}) == []
    clock.advance(4.9)
    assert rewinder.due({"p3": gap, "p1": None}) == []
    clock.advance(0.1)
    assert rewinder.due({"p3": gap, "p1": None}) == ["p3"]
    clock.advance(1.0)
    assert rewinder.due({"p3": gap}) == []  # the seek gets its time to work
    clock.advance(4.0)
    assert rewinder.due({"p3": gap}) == ["p3"]


def test_a_range_that_moves_is_not_due() -> None:
    # A busy partition: committed and acked move on between checks.
    clock = FakeClock()
    rewinder: GapRewinder[str] = GapRewinder(5.0, clock=clock)
    for step in range(20):
        assert rewinder.due({"p0": (100 + step * 10, 200 + step * 10)}) == []
        clock.advance(1.0)


def test_a_range_that_closes_or_a_partition_no_longer_owned_starts_over() -> None:
    clock = FakeClock()
    rewinder: GapRewinder[str] = GapRewinder(5.0, clock=clock)
    rewinder.due({"p0": (1, 2), "p1": (7, 9)})
    clock.advance(4.0)
    rewinder.due({"p0": None})  # p0 closed, p1 revoked
    clock.advance(4.0)
    assert rewinder.due({"p0": (1, 2), "p1": (7, 9)}) == []
    clock.advance(5.0)
    assert sorted(rewinder.due({"p0": (1, 2), "p1": (7, 9)})) == ["p0", "p1"]
