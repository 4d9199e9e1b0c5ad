"""Fakes the unit tests set by hand: a clock they move, and the aggregator's results view.

- ``FakeClock``: ``clock()`` is ``clock.now``; ``advance`` moves it (for the time-based decisions
  of the aggregator and the api's dispatcher, which take a clock).
- ``FakeDispatcher``: what the api's batch service wakes when a batch becomes dispatchable
  (counts the wakes), where no dispatcher runs.
- ``FakeResultsView``: what faust's bookkeeping would tell the stall check (backlog, phase,
  recovery position), as the test sets it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class FakeDispatcher:
    def __init__(self) -> None:
        self.wakes = 0

    def wake(self) -> None:
        self.wakes += 1


@dataclass
class FakeResultsView:
    """What faust's bookkeeping would say, set by the test."""

    waiting: dict[str, int | None] = field(default_factory=lambda: {"results[0]": None})
    current_phase: str = "recovering"
    position: int = 0

    def backlog(self) -> dict[str, int | None]:
        return dict(self.waiting)

    def phase(self) -> str:
        return self.current_phase

    def recovery_position(self) -> int:
        return self.position

    def describe(self) -> dict[str, dict[str, Any]]:
        return {}
