"""A batch's observed completion rate, on a fake clock (the batch object's estimate from it:
tests/unit/shared/test_completion_estimate.py)."""

from __future__ import annotations

import pytest

from services.aggregator.completion_rate import CompletionRates


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def test_the_rate_is_unknown_until_the_counts_span_a_few_seconds() -> None:
    clock = FakeClock()
    rates = CompletionRates(window_s=60, min_span_s=2, clock=clock)
    assert rates.observe("b", 10) is None  # one note: no rate
    clock.now += 1
    assert rates.observe("b", 20) is None  # one second: too short to tell
    clock.now += 1
    assert rates.observe("b", 30) == pytest.approx(10.0)
    clock.now += 5
    assert rates.observe("b", 30) == pytest.approx(20 / 7)  # nothing done lately: slower


def test_the_rate_follows_the_batch_s_current_share_within_the_window() -> None:
    clock = FakeClock()
    rates = CompletionRates(window_s=20, min_span_s=2, clock=clock)
    done = 0
    for _ in range(60):  # alone on the model: 10 lines/s
        clock.now += 1
        done += 10
        rate = rates.observe("big", done)
    assert rate == pytest.approx(10.0)
    for _ in range(30):  # another batch takes half the engines: 5 lines/s
        clock.now += 1
        done += 5
        rate = rates.observe("big", done)
    assert rate == pytest.approx(5.0, rel=0.06)  # the old pace is out of the window
    rates.forget("big")
    clock.now += 1
    assert rates.observe("big", done + 5) is None  # forgotten: starts again


def test_notes_are_thinned_to_about_one_a_second() -> None:
    clock = FakeClock()
    rates = CompletionRates(window_s=10, min_span_s=2, clock=clock)
    for step in range(1, 10_001):  # a flush every millisecond for 10 s
        clock.now += 0.001
        rates.observe("b", step)
    assert len(rates._notes["b"]) <= 12
    assert rates.observe("b", 10_000) == pytest.approx(1_000, rel=0.15)
