"""The worker's progress on each batch's lines, on a fake clock (which lines run on the engine,
the step time learnt from them, the running lines' progress, what a report says)."""

from __future__ import annotations

import pytest

from services.inference.engine import CPU_STEPS, LINE_TIMES
from services.inference.line_progress import MIN_SPEED_LINES, SPEED_LINES, LineProgress


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def warm(progress: LineProgress, clock: FakeClock, seconds: float = 1.0) -> None:
    """Enough lines of 10 tokens, one at a time, each ``seconds`` alone, for a step time."""
    for n in range(MIN_SPEED_LINES):
        progress.started(f"warm{n}", "warm", 10)
        clock.now += seconds
        progress.ended(f"warm{n}", answered=True, ok=True)


def test_the_step_time_is_learnt_from_the_lines_answered_ok() -> None:
    clock = FakeClock()
    progress = LineProgress(cost=LINE_TIMES, clock=clock, wall=lambda: 5_000.0)
    for n in range(MIN_SPEED_LINES):
        assert progress.scale() is None  # not before enough lines
        progress.started(f"r{n}", "b", 100)
        progress.started(f"refused{n}", "b", 20)
        clock.now += 2.0
        progress.ended(f"r{n}", answered=True, ok=True)  # 100 tokens in 2 s
        progress.ended(f"refused{n}", answered=True, ok=False)  # done, but says nothing of the time
    assert progress.scale() == pytest.approx(0.02)
    first = progress.reports()["b"]
    assert (first.at, first.finished_lines, first.finished_tokens, first.running, first.rate) == (
        5_000.0,
        2 * MIN_SPEED_LINES,
        120 * MIN_SPEED_LINES,
        0,
        None,
    )
    assert progress.reports() == {}  # nothing since: the batch is forgotten


def test_on_a_cpu_lines_share_the_steps() -> None:
    clock = FakeClock()
    progress = LineProgress(cost=CPU_STEPS, clock=clock)
    warm(progress, clock)  # alone: 0.1 s a token
    progress.started("long", "b", 100)
    progress.started("short", "b", 5)
    progress.started("direct", None, None)  # a pipeline's request: not reported, but it runs
    clock.now += 3.0
    report = progress.reports()["b"]
    # Three lines share each 0.3 s step: long made 10 of 100, short 5 of 5 (at most its length);
    # the batch makes 2 tokens a step. Its 90 tokens left then run beside the direct request only.
    assert (report.running, report.running_tokens) == (2, 15.0)
    assert report.rate == pytest.approx(2 / 0.3, abs=0.001)
    assert report.longest_s == pytest.approx(90 * 0.2)
    assert (report.finished_lines, report.finished_tokens) == (0, 0)


def test_on_an_engine_of_line_times_the_longest_line_decides() -> None:
    clock = FakeClock()
    progress = LineProgress(cost=LINE_TIMES, clock=clock)
    warm(progress, clock)  # 0.1 s a token, whatever runs beside it
    for run, tokens in (("a", 40), ("b", 100), ("c", 70)):
        progress.started(run, "batch", tokens)
    clock.now += 1.0
    report = progress.reports()["batch"]
    assert report.running_tokens == 30.0 and report.rate == pytest.approx(30.0)
    assert report.longest_s == pytest.approx(9.0)  # b's 90 tokens left


def test_lines_beyond_the_engine_s_capacity_start_as_running_ones_end() -> None:
    clock = FakeClock()
    progress = LineProgress(capacity=2, cost=CPU_STEPS, clock=clock)
    warm(progress, clock, seconds=2.5)  # 0.25 s a token alone
    for run in ("a", "b", "c"):  # c waits inside the engine
        progress.started(run, "batch", 10)
    clock.now += 1.0
    assert progress.reports()["batch"].running == 2
    progress.ended("a", answered=True, ok=True)  # c starts now
    clock.now += 4.0
    progress.ended("c", answered=True, ok=True)  # the 4 s it ran, not 5
    # a and c each made 10 tokens on half the engine: 1 s and 4 s for 2 x 10 tokens of steps,
    # beside the warm-up's 8 x 2.5 s for 8 x 10.
    assert progress.scale() == pytest.approx((5 + 20) / (40 + 80))
    progress.started("d", "batch", 10)
    progress.started("e", "batch", 10)  # waits: b and d run
    progress.ended("e", answered=False)  # aborted while waiting
    assert progress.reports()["batch"].running == 2


def test_a_line_that_leaves_unanswered_is_neither_finished_nor_timed() -> None:
    clock = FakeClock()
    progress = LineProgress(clock=clock)
    progress.started("r", "b", 50)
    clock.now += 1.0
    progress.ended("r", answered=False)  # aborted or preempted: it runs again
    assert progress.scale() is None and not progress._runs
    assert progress.reports() == {}
    progress.ended("unknown", answered=True, ok=True)  # not started here: ignored


def test_the_step_time_follows_the_last_lines() -> None:
    clock = FakeClock()
    progress = LineProgress(cost=CPU_STEPS, clock=clock)
    for n in range(SPEED_LINES):  # slow lines first
        progress.started(f"slow{n}", "b", 10)
        clock.now += 10.0
        progress.ended(f"slow{n}", answered=True, ok=True)
    for n in range(SPEED_LINES):  # then as many fast ones: the slow ones are forgotten
        progress.started(f"fast{n}", "b", 10)
        clock.now += 1.0
        progress.ended(f"fast{n}", answered=True, ok=True)
    assert progress.scale() == pytest.approx(0.1)


def test_waiting_lines_start_by_priority_then_arrival() -> None:
    clock = FakeClock()
    progress = LineProgress(capacity=1, clock=clock)
    progress.started("a", "first", 10, priority=0)
    progress.started("b", "later", 10, priority=5)
    progress.started("c", "urgent", 10, priority=1)  # came after b, starts before it
    progress.started("d", "urgent", 10, priority=1)
    progress.ended("c", answered=False)  # aborted while waiting: d is next of priority 1
    clock.now += 1.0
    progress.ended("a", answered=True, ok=True)
    reports = progress.reports()
    assert (reports["urgent"].running, reports["later"].running) == (1, 0)
