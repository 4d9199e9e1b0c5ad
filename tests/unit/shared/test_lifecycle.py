"""The batch lifecycle: which status may follow which, and the named groups."""

from __future__ import annotations

import pytest

from shared import lifecycle


@pytest.mark.parametrize(
    ("current", "target"),
    [
        ("validating", "in_progress"),
        ("validating", "failed"),
        ("validating", "cancelling"),
        ("validating", "expired"),
        ("in_progress", "finalizing"),
        ("in_progress", "cancelling"),
        ("in_progress", "expired"),
        ("finalizing", "completed"),
        ("finalizing", "cancelling"),
        ("cancelling", "cancelled"),
        ("cancelling", "completed"),
    ],
)
def test_allowed_moves(current: str, target: str) -> None:
    assert lifecycle.allowed(current, target)


@pytest.mark.parametrize(
    ("current", "target"),
    [
        ("completed", "cancelling"),
        ("failed", "in_progress"),
        ("expired", "completed"),
        ("cancelled", "completed"),
        ("in_progress", "validating"),
        ("finalizing", "in_progress"),
        ("validating", "completed"),
        ("validating", "cancelled"),
        ("in_progress", "cancelled"),
        ("cancelling", "in_progress"),
        ("unknown", "failed"),
    ],
)
def test_refused_moves(current: str, target: str) -> None:
    assert not lifecycle.allowed(current, target)


def test_no_move_leaves_a_terminal_status() -> None:
    assert lifecycle.TERMINAL == {"completed", "failed", "expired", "cancelled"}
    for status in lifecycle.TERMINAL:
        assert not any(lifecycle.allowed(status, target) for target in lifecycle.STATUSES)


def test_sources_are_the_guard_of_each_move() -> None:
    assert lifecycle.sources("in_progress") == {"validating"}
    assert lifecycle.sources("finalizing") == {"in_progress"}
    assert lifecycle.sources("cancelled") == {"cancelling"}
    assert lifecycle.sources("cancelling") == {"validating", "in_progress", "finalizing"}
    assert not lifecycle.sources("completed") & lifecycle.TERMINAL
    with pytest.raises(lifecycle.TransitionRefused):
        lifecycle.sources("validating")  # a batch is created validating; nothing moves back to it


def test_groups() -> None:
    assert lifecycle.OPEN == set(lifecycle.STATUSES) - lifecycle.TERMINAL
    assert lifecycle.RUNNING < lifecycle.OPEN
    assert lifecycle.COUNTING < lifecycle.RUNNING
    assert "validating" in lifecycle.EXPIRABLE and "cancelling" not in lifecycle.EXPIRABLE
