"""The engine's places: at most ``places`` lines run on the engine at once; the rest wait here.

Why the worker holds them rather than vLLM's own queue: a line waiting inside the engine takes the
first place that frees, whatever arrives after it. A place freed for a young batch's line (the
preemption in ``handler.py``) would then often go to a line that was already waiting (the abort
reaches the engine before the young line is tokenized and added). Waiting here, the only lines
inside the engine are the running ones and the young lines let in over the limit, so a freed place
is the young line's. Waiters are let in lowest rank first (the handler's rank: how many lines the
batch has in the worker), then in arrival order.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from dataclasses import dataclass, field

from services.inference.engine import RequestAborted


@dataclass(order=True)
class _Waiter:
    rank: int
    order: int
    group: str = field(compare=False)
    granted: asyncio.Future[None] = field(compare=False)


class EnginePlaces:
    """A priority semaphore over the engine's places; 0 places: no limit (nothing waits)."""

    def __init__(self, places: int) -> None:
        self.places = places
        self.used = 0
        self._waiting: list[_Waiter] = []
        self._arrivals = itertools.count()

    @property
    def full(self) -> bool:
        return 0 < self.places <= self.used

    def waiting(self) -> int:
        return sum(not w.granted.done() for w in self._waiting)

    async def take(self, rank: int, group: str) -> None:
        """Wait for a place (at once when one is free). Raises ``RequestAborted`` when ``drop``
        drops the group's waiters (a cancelled batch)."""
        if not self.full and not self._waiting:
            self.used += 1
            return
        waiter = _Waiter(rank, next(self._arrivals), group, asyncio.get_running_loop().create_future())
        heapq.heappush(self._waiting, waiter)
        try:
            await waiter.granted
        except asyncio.CancelledError:
            granted = waiter.granted
            if granted.done() and not granted.cancelled() and granted.exception() is None:
                self.give_back()  # granted, but the task was cancelled before it could run
            else:
                waiter.granted.cancel()
            raise

    def take_over_limit(self) -> None:
        """A place beyond the limit (a young line that preempts one: the place comes back when
        the preempted line gives its place back)."""
        self.used += 1

    def give_back(self) -> None:
        self.used -= 1
        while self._waiting and not self.full:
            waiter = heapq.heappop(self._waiting)
            if not waiter.granted.done():
                self.used += 1
                waiter.granted.set_result(None)

    def drop(self, group: str) -> None:
        """The group's waiters stop waiting: their ``take`` raises ``RequestAborted``."""
        for waiter in self._waiting:
            if waiter.group == group and not waiter.granted.done():
                waiter.granted.set_exception(RequestAborted(group))
        self._waiting = [w for w in self._waiting if not w.granted.done()]
        heapq.heapify(self._waiting)
