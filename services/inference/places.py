"""The engine's places: at most ``places`` lines run on the engine at once; the rest wait here.

Why the worker holds them rather than vLLM's own queue: a line waiting inside the engine takes the
first place that frees, whatever arrives after it. A place freed for a young batch's line (the
preemption in ``handler.py``) would then often go to a line that was already waiting (the abort
reaches the engine before the young line is tokenized and added). Waiting here, the only lines
inside the engine are the running ones and the young lines let in over the limit, so a freed place
is the young line's.

Waiters queue per group (a batch; direct requests are one group), first in first out. A freed
place goes to the group with the fewest lines on the engine at that moment (ties: the group whose
first waiter came first), so a batch that has just arrived runs next, and no waiting group starves
behind later arrivals: its count only falls while it waits.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque

from services.inference.engine import RequestAborted

_Waiter = tuple[int, asyncio.Future[None]]  # (arrival, granted)


class EnginePlaces:
    """A per-group priority semaphore over the engine's places; 0 places: no limit."""

    def __init__(self, places: int) -> None:
        self.places = places
        self.used = 0
        self._running: dict[str, int] = {}
        self._queues: dict[str, deque[_Waiter]] = {}
        self._arrivals = itertools.count()

    @property
    def full(self) -> bool:
        return 0 < self.places <= self.used

    def running(self, group: str) -> int:
        return self._running.get(group, 0)

    def holding(self, group: str) -> int:
        """The group's lines here: on the engine or waiting for a place."""
        return self.running(group) + len(self._queues.get(group, ()))

    def waiting(self) -> int:
        return sum(len(queue) for queue in self._queues.values())

    def try_take(self, group: str) -> bool:
        """Take a free place if one is free and nobody waits for it."""
        if self.full or self._queues:
            return False
        self._grant(group)
        return True

    async def take(self, group: str) -> None:
        """Wait for a place (at once when one is free). Raises ``RequestAborted`` when ``drop``
        drops the group's waiters (a cancelled batch)."""
        if self.try_take(group):
            return
        waiter: _Waiter = (next(self._arrivals), asyncio.get_running_loop().create_future())
        self._queues.setdefault(group, deque()).append(waiter)
        granted = waiter[1]
        try:
            await granted
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled() and granted.exception() is None:
                self.give_back(group)  # granted, but the task was cancelled before it could run
            else:  # still queued (the task's cancellation cancelled the future), or dropped
                self._unqueue(group, waiter)
            raise

    def take_over_limit(self, group: str) -> None:
        """A place beyond the limit (a young line that preempts one: the place comes back when
        the preempted line gives its place back)."""
        self._grant(group)

    def give_back(self, group: str) -> None:
        self.used -= 1
        left = self._running[group] - 1
        if left:
            self._running[group] = left
        else:
            del self._running[group]
        self._admit()

    def drop(self, group: str) -> None:
        """The group's waiters stop waiting: their ``take`` raises ``RequestAborted``."""
        for _, granted in self._queues.pop(group, ()):
            granted.set_exception(RequestAborted(group))

    def _grant(self, group: str) -> None:
        self.used += 1
        self._running[group] = self._running.get(group, 0) + 1

    def _admit(self) -> None:
        while self._queues and not self.full:
            group = min(self._queues, key=lambda g: (self.running(g), self._queues[g][0][0]))
            queue = self._queues[group]
            _, granted = queue.popleft()
            if not queue:
                del self._queues[group]
            if granted.done():  # cancelled, its task not resumed yet to unqueue it
                continue
            self._grant(group)
            granted.set_result(None)

    def _unqueue(self, group: str, waiter: _Waiter) -> None:
        queue = self._queues.get(group)
        if queue is not None and waiter in queue:
            queue.remove(waiter)
            if not queue:
                del self._queues[group]
