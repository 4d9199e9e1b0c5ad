"""A batch's observed completion rate, the basis of its estimated completion time.

Each time the aggregator writes a batch's live counts it also notes how many of its lines are
done (completed + failed) and when; the rate is the lines done over the last ``WINDOW_S`` seconds
of those notes. A recent window, not the batch's whole life, because what a batch gets changes as
it runs: the engines' lines are shared between the batches queued on a model (the dispatcher's
fair share, the workers' places), so a batch alone runs at the model's whole rate and slows when
another starts; the window follows its current share within about ``WINDOW_S``. The api turns the
rate into ``estimated_completion_at`` where the batch's work cannot be counted
(``shared/completion_estimate.py``): the rate's time plus the lines not done at that rate.

Memory: at most one note per ``NOTE_INTERVAL_S`` per batch, for ``WINDOW_S`` (a few dozen numbers
per batch being counted); a batch's notes go when it is forgotten.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

WINDOW_S = 60.0
"""The rate is measured over the last this many seconds (or the batch's life, when shorter)."""
MIN_SPAN_S = 2.0
"""No rate until the notes span this long (a first flush's burst says little)."""
NOTE_INTERVAL_S = 1.0
"""At most one note per batch per this many seconds (the newest replaces a closer one)."""


class CompletionRates:
    """Lines done per second per batch, over a sliding window of the counts written."""

    def __init__(
        self,
        window_s: float = WINDOW_S,
        min_span_s: float = MIN_SPAN_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.window_s, self.min_span_s = window_s, min_span_s
        self._clock = clock
        self._notes: dict[str, deque[tuple[float, int]]] = {}

    def observe(self, batch_id: str, done: int) -> float | None:
        """Note that ``done`` of the batch's lines have a result now; returns its rate in lines per
        second over the window, or None while it cannot be told (too short, nothing done)."""
        now = self._clock()
        notes = self._notes.setdefault(batch_id, deque())
        if len(notes) >= 2 and now - notes[-2][0] < NOTE_INTERVAL_S:
            notes[-1] = (now, done)  # thin the notes: the newest one stands for the last second
        else:
            notes.append((now, done))
        # Keep one note at or before the window's start, so the window is always covered.
        while len(notes) > 2 and now - notes[1][0] >= self.window_s:
            notes.popleft()
        then, done_then = notes[0]
        span = now - then
        if span < self.min_span_s or done <= done_then:
            return None
        return (done - done_then) / span

    def forget(self, batch_id: str) -> None:
        self._notes.pop(batch_id, None)
