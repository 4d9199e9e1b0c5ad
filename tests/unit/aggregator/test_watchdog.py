"""The stall decision, driven by a fake clock."""

from __future__ import annotations

from services.aggregator.watchdog import StallWatchdog
from tests.support.fakes import FakeClock


def make(timeout_s: float = 120.0, unassigned_timeout_s: float = 0.0) -> tuple[StallWatchdog, FakeClock]:
    clock = FakeClock()
    return StallWatchdog(timeout_s, unassigned_timeout_s, clock=clock), clock


def test_idle_worker_with_nothing_waiting_never_stalls() -> None:
    watchdog, clock = make()
    for _ in range(100):
        clock.advance(60)
        assert watchdog.check({"results[0]": 0, "results[1]": 0}) is None
    assert watchdog.check({}) is None  # no partitions owned
    assert not watchdog.stalled


def test_results_waiting_without_progress_for_the_timeout_is_a_stall() -> None:
    watchdog, clock = make()
    assert watchdog.check({"results[0]": 5}) is None
    clock.advance(119)
    assert watchdog.check({"results[0]": 5}) is None
    clock.advance(1)
    reason = watchdog.check({"results[0]": 5, "results[1]": 0})
    assert reason is not None and watchdog.stalled
    assert "120 s" in reason and "results[0]: 5 waiting" in reason and "results[1]" not in reason


def test_work_arriving_after_a_quiet_spell_gets_the_full_timeout() -> None:
    watchdog, clock = make()
    clock.advance(3600)  # nothing processed for an hour, nothing to process either
    assert watchdog.check({"results[0]": 0}) is None
    clock.advance(5)
    assert watchdog.check({"results[0]": 300}) is None  # work just arrived
    clock.advance(60)
    assert watchdog.check({"results[0]": 300}) is None
    clock.advance(60)
    assert watchdog.check({"results[0]": 300}) is not None


def test_progress_keeps_a_busy_worker_alive() -> None:
    watchdog, clock = make()
    for _ in range(20):
        clock.advance(100)
        watchdog.progress()  # a chunk received, or a retry while a dependency is down
        assert watchdog.check({"results[0]": 10_000}) is None
    clock.advance(120)
    assert watchdog.check({"results[0]": 10_000}) is not None


def test_backlog_cleared_resets_the_waiting_time() -> None:
    watchdog, clock = make()
    watchdog.check({"results[0]": 3})
    clock.advance(100)
    assert watchdog.check({"results[0]": 0}) is None  # drained (committed caught up)
    clock.advance(10)
    assert watchdog.check({"results[0]": 3}) is None  # waiting again, counted from now
    clock.advance(119)
    assert watchdog.check({"results[0]": 3}) is None
    clock.advance(1)
    assert watchdog.check({"results[0]": 3}) is not None


def test_no_fetch_answer_counts_as_waiting() -> None:
    """A consumer stuck before its first fetch must not look idle."""
    watchdog, clock = make()
    watchdog.check({"results[0]": None})
    clock.advance(120)
    reason = watchdog.check({"results[0]": None})
    assert reason is not None and "no fetch answer yet" in reason


def test_a_stall_is_final() -> None:
    watchdog, clock = make(timeout_s=10)
    watchdog.check({"results[0]": 1})
    clock.advance(10)
    reason = watchdog.check({"results[0]": 1})
    assert reason is not None
    watchdog.progress()
    assert watchdog.check({"results[0]": 0}) == reason and watchdog.stalled


def test_zero_timeout_means_any_results_seen_waiting() -> None:
    watchdog, _ = make(timeout_s=0)
    assert watchdog.check({"results[0]": 0}) is None
    assert watchdog.check({"results[0]": 1}) is not None


def test_owning_no_partition_for_the_unassigned_timeout_is_a_stall() -> None:
    watchdog, clock = make(unassigned_timeout_s=300)
    assert watchdog.check({}) is None
    clock.advance(200)
    assert watchdog.check({"results[0]": 0}) is None  # assigned meanwhile: the wait starts again
    assert watchdog.check({}) is None
    clock.advance(299)
    assert watchdog.check({}) is None
    clock.advance(1)
    reason = watchdog.check({})
    assert reason is not None and "owned no results partition for 300 s" in reason


def test_owning_nothing_is_fine_when_the_unassigned_timeout_is_off() -> None:
    watchdog, clock = make(unassigned_timeout_s=0)
    watchdog.check({})
    clock.advance(10_000)
    assert watchdog.check({}) is None
