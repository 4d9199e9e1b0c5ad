"""What this worker's engine is doing for each batch, written for the batch's estimated completion
time (``shared/completion_estimate.py`` says how the api reads it).

The handler tells ``LineProgress`` when a batch line takes a place on the engine and when it
leaves it; every ``REPORT_INTERVAL_S`` the reporter writes, for each batch with lines running or
finished since the last report, the finished lines and their expected tokens (added to what the
batch document holds) and the running lines' state (replacing it): one bulk write per interval,
never one per line. A database that does not answer only logs: the estimate falls back to the
batch's line rate.

How the engine's step time and a line's progress are told: ``LineProgress``. A refused line
costs no engine time and says nothing of the step time. Memory: the lines on the engine (a few
numbers each) and the batches they belong to.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from pymongo.errors import PyMongoError

from services.inference.engine import CPU_STEPS, StepCost
from shared.completion_estimate import REPORT_INTERVAL_S, EngineProgress, worker_key
from shared.mongo import Mongo
from shared.stores.batch_progress import BatchProgressStore

log = logging.getLogger(__name__)

REPORT_TIMEOUT_S = 2.0
"""A report not written by then is given up (a database that stops answering would hold it, and
a draining worker's last one, for good)."""
SPEED_LINES = 32
"""The engine's step time is learnt from its last this many lines answered OK..."""
MIN_SPEED_LINES = 8
"""...once there are this many: the first lines of a busy engine carry the prefill of all the
prompts that came with them, and alone they put the step time far too high."""


@dataclass
class _Line:
    batch_id: str | None
    expected: int | None  # tokens; None: not a batch line with an output cap (not reported)
    started: float | None = None  # when it started on the engine; None: waiting inside it
    lines: float = 0.0  # the lines-running integral then


@dataclass
class _Finished:
    lines: int = 0
    tokens: int = 0


class LineProgress:
    """The lines on this worker's engine, by batch, and the time a step takes on it.

    Every line the worker hands to the engine is told (``started``, ``ended``), reported or not,
    so that it is known which run: the engine runs ``capacity`` lines (its ``max_running``; 0:
    all) and the lines beyond it wait inside it, starting as running ones end by their priority,
    then in the order they came (vLLM's priority scheduling; all of one priority: first come,
    first served).

    **The step time.** A step with ``n`` lines takes ``scale * cost(n)``, ``cost`` being the
    engine's ``StepCost`` (on a CPU about in proportion to ``n``, on a GPU nearly flat): a line
    that ran ``seconds`` with ``m`` lines on the engine on average made about ``seconds /
    (scale * cost(m))`` tokens. The scale is learnt from the last ``SPEED_LINES`` lines answered
    OK (their seconds over their expected tokens times the cost at their ``m``). So a running line
    has come its age over the step time at its own average so far (at most its expected length),
    a batch goes at its running lines over the step time now, and its running lines need, at the
    least, the time they take to run down: the shortest ends first, and the steps after it hold
    one line fewer.
    """

    def __init__(
        self,
        capacity: int = 0,
        cost: StepCost = CPU_STEPS,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.capacity, self.cost = capacity, cost
        self._clock, self._wall = clock, wall
        self._lines: dict[str, _Line] = {}  # run id -> line
        # Lines waiting inside the engine: (priority, arrival, run id), a heap; one that left is
        # skipped when it comes up.
        self._waiting: list[tuple[int, int, str]] = []
        self._arrivals = itertools.count()
        self._running = 0
        self._integral = 0.0  # of the lines running over time, up to ``_integral_at``
        self._integral_at = clock()
        self._finished: dict[str, _Finished] = {}  # batch -> finished since the last report
        self._runs: deque[tuple[float, float]] = deque(maxlen=SPEED_LINES)  # (seconds, tokens x cost)

    def _advance(self) -> tuple[float, float]:
        """The clock and the lines-running integral now."""
        now = self._clock()
        self._integral += (now - self._integral_at) * self._running
        self._integral_at = now
        return now, self._integral

    def _start(self, line: _Line, now: float, integral: float) -> None:
        line.started, line.lines = now, integral
        self._running += 1

    def started(
        self, run_id: str, batch_id: str | None = None, expected: int | None = None, priority: int = 0
    ) -> None:
        """A line was handed to the engine: of ``batch_id``, expected to generate ``expected``
        tokens (None: not reported, but it takes a place all the same), at ``priority`` (lower
        starts first)."""
        now, integral = self._advance()
        line = self._lines[run_id] = _Line(batch_id, expected)
        if self.capacity and self._running >= self.capacity:
            heapq.heappush(self._waiting, (priority, next(self._arrivals), run_id))
        else:
            self._start(line, now, integral)
        if batch_id is not None and expected is not None:
            self._finished.setdefault(batch_id, _Finished())

    def ended(self, run_id: str, *, answered: bool, ok: bool = False) -> None:
        """The line left the engine: ``answered`` (its result goes out; ``ok``: a 200 answer) or
        not (aborted, preempted, a shutdown: it runs again, here or elsewhere)."""
        line = self._lines.pop(run_id, None)
        if line is None:
            return
        now, integral = self._advance()
        if line.started is not None:
            self._running -= 1
            while self._waiting and (not self.capacity or self._running < self.capacity):
                waiter = self._lines.get(heapq.heappop(self._waiting)[2])
                if waiter is not None and waiter.started is None:
                    self._start(waiter, now, integral)
        if not answered or line.batch_id is None or line.expected is None:
            return
        finished = self._finished.setdefault(line.batch_id, _Finished())
        finished.lines += 1
        finished.tokens += line.expected
        if ok and line.started is not None and now > line.started:
            seconds = now - line.started
            self._runs.append((seconds, line.expected * self.cost((integral - line.lines) / seconds)))

    def scale(self) -> float | None:
        """The step time's scale, lately; None before ``MIN_SPEED_LINES`` lines were answered."""
        if len(self._runs) < MIN_SPEED_LINES:
            return None
        work = sum(w for _, w in self._runs)
        return sum(s for s, _ in self._runs) / work if work > 0 else None

    def reports(self) -> dict[str, EngineProgress]:
        """Each batch's progress since the last call (``finished_*``: what finished since then),
        for the batches with lines on the engine or finished since; a batch with neither is
        forgotten."""
        now, integral = self._advance()
        scale, running = self.scale(), self._running
        left: dict[str, list[float]] = {}  # batch -> its running lines' tokens left
        come: dict[str, float] = {}
        for line in self._lines.values():
            if line.batch_id is None or line.expected is None or line.batch_id not in self._finished:
                continue
            tokens = left.setdefault(line.batch_id, [])
            if line.started is None:
                continue
            made = 0.0
            if scale and now > line.started:
                age = now - line.started
                made = min(float(line.expected), age / (scale * self.cost((integral - line.lines) / age)))
            come[line.batch_id] = come.get(line.batch_id, 0.0) + made
            tokens.append(line.expected - made)
        at, out = self._wall(), {}
        for batch_id, finished in list(self._finished.items()):
            if batch_id not in left and not finished.lines:
                del self._finished[batch_id]
                continue
            tokens = left.get(batch_id, [])
            lines = len(tokens)
            out[batch_id] = EngineProgress(
                at=at,
                finished_lines=finished.lines,
                finished_tokens=finished.tokens,
                running=lines,
                running_tokens=round(come.get(batch_id, 0.0), 1),
                rate=round(lines / (scale * self.cost(running)), 3) if scale and lines else None,
                longest_s=round(self._run_down(tokens, running - lines, scale), 3) if scale else 0.0,
            )
            self._finished[batch_id] = _Finished()
        return out

    def _run_down(self, tokens: list[float], others: int, scale: float) -> float:
        """Seconds until the last of lines with ``tokens`` left ends, ``others`` running beside
        them throughout: the shortest ends first, and each step after it holds one line fewer. A
        bound from below: a line waiting inside the engine may take a freed place (and end in
        its turn), which no count of it here could say without running the queue."""
        seconds, done, lines = 0.0, 0.0, len(tokens)
        for left in sorted(tokens):
            seconds += (left - done) * scale * self.cost(lines + others)
            done, lines = left, lines - 1
        return seconds


async def report(mongo: Mongo, progress: LineProgress, worker: str) -> None:
    """Write ``progress.reports()`` once, in at most ``REPORT_TIMEOUT_S``; a failure only logs (the
    finished lines of a failed write are not written again: the estimate is an estimate). A
    drained worker's last report says its lines have ended."""
    try:
        reports = progress.reports()
        if reports:
            write = BatchProgressStore(mongo.batches).engine_progress(worker_key(worker), reports)
            await asyncio.wait_for(write, REPORT_TIMEOUT_S)
    except (PyMongoError, TimeoutError) as exc:
        log.warning("writing the engine's progress failed: %r", exc)
    except Exception:
        log.exception("reporting the engine's progress failed")


async def report_forever(
    mongo: Mongo, progress: LineProgress, worker: str, interval_s: float = REPORT_INTERVAL_S
) -> None:
    """``report`` every ``interval_s``."""
    while True:
        await asyncio.sleep(interval_s)
        await report(mongo, progress, worker)
