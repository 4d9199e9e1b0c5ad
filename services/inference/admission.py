"""How many lines a worker keeps on a server it shares with live traffic: additive increase,
multiplicative decrease (AIMD), as TCP shares a link.

The remote engine sends lines to a server a team already runs for its live users. The server
runs a bounded number of sequences; what it cannot run waits in its queue, and a live request
that arrives then waits behind batch lines. So the worker keeps the server's waiting queue near
empty: it lets on another line only while the server shows room, and takes lines back as soon as
requests wait there. Three signals, strongest first:

- **the server's load** (vLLM's ``vllm:num_requests_waiting``, read from its ``/metrics`` every
  ``remote_load_interval_s``): requests waiting beyond ``remote_waiting_target`` halve the
  limit (times ``decrease``); a reading with none waiting while the worker used its whole limit
  adds one line (``increase``);
- **refusals** (429, or 503 with ``Retry-After``): the limit falls at once, and no new line goes
  on until ``Retry-After`` has passed;
- **latency**, for a server without vLLM's metrics: each answer's seconds per output token,
  smoothed, against the best seen lately; ``remote_latency_tolerance`` times that best
  means the server is saturated (on a GPU a step costs about the same with more sequences until
  it is full; on a CPU every sequence added costs, so the tolerance is the price paid per step).

A decrease counts once per round trip (the lines on the server when it happened must come back
before the next one counts), so one burst of signals does not collapse the limit. The limit
stays between ``floor`` (1: the batch always moves) and ``ceiling`` (what the worker may have on
the engine). Pure bookkeeping with an injected clock; the gate that holds lines back is
``AdmissionGate``.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field


class AdmissionLimit:
    """The number of lines allowed on the server now, and until when none may go on."""

    def __init__(
        self,
        ceiling: int,
        *,
        floor: int = 1,
        start: int | None = None,
        increase: float = 1.0,
        decrease: float = 0.5,
        waiting_target: int = 0,
        latency_tolerance: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 1 <= floor <= ceiling:
            raise ValueError(f"need 1 <= floor ({floor}) <= ceiling ({ceiling})")
        self.ceiling = ceiling
        self.floor = floor
        self.limit = float(min(ceiling, max(floor, start if start is not None else floor)))
        self.increase = increase
        self.decrease = decrease
        self.waiting_target = waiting_target
        self.latency_tolerance = latency_tolerance
        self.clock = clock
        self.held_until = 0.0
        self.decreases = 0
        self._answers = 0  # answers seen; a decrease waits for a round trip after the last
        self._next_decrease_at = 0
        self._smoothed: float | None = None  # seconds per output token, smoothed
        self._best: float | None = None  # the best smoothed figure lately (slowly forgotten)

    @property
    def allowed(self) -> int:
        """Lines allowed on the server now (0 while a refusal's ``Retry-After`` runs)."""
        if self.clock() < self.held_until:
            return 0
        return int(self.limit)

    def server_load(self, waiting: float, used: int) -> None:
        """A reading of the server's queue: ``waiting`` requests wait there (all clients'),
        ``used`` lines of ours are on it."""
        if waiting > self.waiting_target:
            self._decrease()
        elif used >= int(self.limit):
            self._increase(self.increase)

    def refused(self, retry_after_s: float | None) -> None:
        """The server refused a line for load (429, or 503 naming ``Retry-After``)."""
        self._decrease()
        if retry_after_s:
            self.held_until = max(self.held_until, self.clock() + retry_after_s)

    def answered(self, seconds: float, output_tokens: int, used: int, by_latency: bool) -> None:
        """A line came back after ``seconds`` with ``output_tokens``; ``used`` lines of ours
        were on the server. ``by_latency``: the server has no load reading, adapt on this."""
        self._answers += 1
        if not by_latency:
            return
        per_token = seconds / max(1, output_tokens)
        self._smoothed = per_token if self._smoothed is None else 0.8 * self._smoothed + 0.2 * per_token
        # The best lately, forgotten slowly (0.1% a line) so a server that got slower for good
        # (other traffic, a longer model) becomes the new normal rather than a steady alarm.
        self._best = self._smoothed if self._best is None else min(self._best * 1.001, self._smoothed)
        if self._smoothed > self._best * self.latency_tolerance:
            self._decrease()
        elif used >= int(self.limit):
            self._increase(self.increase / max(1.0, self.limit))  # one line per limit's answers

    def _increase(self, step: float) -> None:
        self.limit = min(float(self.ceiling), self.limit + step)

    def _decrease(self) -> None:
        if self._answers < self._next_decrease_at:
            return  # the last decrease has not shown its effect yet
        self.limit = max(float(self.floor), self.limit * self.decrease)
        self._next_decrease_at = self._answers + max(1, int(self.limit))
        self.decreases += 1


@dataclass(order=True)
class _Waiter:
    priority: int
    arrival: int
    granted: asyncio.Future[None] = field(compare=False, repr=False)


class AdmissionGate:
    """Lines wait here for the server, lowest ``priority`` first (ties: first come), while as
    many of ours as ``limit.allowed`` are on it. ``wake`` after the limit changed."""

    def __init__(self, limit: AdmissionLimit) -> None:
        self.limit = limit
        self.used = 0
        self._waiters: list[_Waiter] = []
        self._arrivals = itertools.count()
        self._timer: asyncio.TimerHandle | None = None

    @property
    def waiting(self) -> int:
        return sum(1 for w in self._waiters if not w.granted.done())

    @asynccontextmanager
    async def slot(self, priority: int = 0) -> AsyncIterator[None]:
        """Hold one place on the server while the block runs; cancellation-safe."""
        if not self._waiters and self.used < self.limit.allowed:
            self.used += 1
        else:
            waiter = _Waiter(priority, next(self._arrivals), asyncio.get_running_loop().create_future())
            heapq.heappush(self._waiters, waiter)
            self.wake()
            try:
                await waiter.granted
            except asyncio.CancelledError:
                if waiter.granted.done() and not waiter.granted.cancelled():
                    self._release()  # granted, but cancelled before it could run
                raise
        try:
            yield
        finally:
            self._release()

    def wake(self) -> None:
        """Let waiters on while the limit allows; while a refusal holds every line back, look
        again when it ends."""
        allowed = self.limit.allowed
        while self._waiters and self.used < allowed:
            waiter = heapq.heappop(self._waiters)
            if waiter.granted.done():  # cancelled while waiting
                continue
            self.used += 1
            waiter.granted.set_result(None)
        if self._waiters and allowed == 0 and self._timer is None:
            delay = max(0.0, self.limit.held_until - self.limit.clock())
            self._timer = asyncio.get_running_loop().call_later(delay, self._held_ended)

    def _held_ended(self) -> None:
        self._timer = None
        self.wake()

    def _release(self) -> None:
        self.used -= 1
        self.wake()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
