"""A batch's estimated completion time (``estimated_completion_at``), and the progress reports the
inference workers write for it.

Counting lines is not enough where lengths differ: a batch sent longest first finishes its short
lines while its long ones run, so its lines per second fall as it nears its end. So the estimate
counts work, in expected output tokens (a line's expected length: ``shared/expected_output.py``),
whenever every line of the batch has one (``expected_tokens``, summed at validation):

- Every worker running lines of a batch writes, every ``REPORT_INTERVAL_S`` while it has lines
  of it on its engine or finished since its last report, an ``EngineProgress`` under
  ``engine_progress.<worker>`` of the batch document: the lines it finished and their expected
  tokens (added up), the lines on its engine now and how far they have come, the batch's rate
  there, and how long its running lines need to run down (services/inference/line_progress.py:
  from the engine's step time, learnt from the lines it ran, and how a step's cost grows with
  the lines in it on that engine: a CPU's in proportion, a GPU's hardly).
- The work left is the batch's expected tokens less the finished lines' and the running lines'
  progress; the batch ends when the work left is done at the summed rate of the workers that
  reported within ``FRESH_S`` of the newest report, and not before its running lines run down.

Otherwise (a line without an output cap, or no worker has reported lately with a rate) the
estimate is the lines left at the aggregator's observed lines per second
(``completion_rate``: services/aggregator/completion_rate.py).

What it cannot see: another batch's lines that start later and take places, or end and free
them (the rate follows within a report), and on a GPU, where a step costs nearly as much for one
line as for dozens, that the batch's rate falls as fewer of its lines run at its end (the
estimate is then early; the running lines' run-down catches only those already running).
"""

from __future__ import annotations

import math
import re
from typing import Any

from pydantic import BaseModel

REPORT_INTERVAL_S = 1.0
"""How often a worker writes its progress on each batch it runs lines of."""
FRESH_S = 10 * REPORT_INTERVAL_S
"""A report older than this counts only its finished lines (its worker has stopped, or runs none
of the batch now); the margin leaves room for the hosts' clocks."""
FIELD = "engine_progress"
"""The batch document's field of the reports, by worker."""


class EngineProgress(BaseModel):
    """One worker's progress on one batch (``engine_progress.<worker>``)."""

    at: float  # unix seconds
    finished_lines: int = 0
    finished_tokens: int = 0  # their expected tokens
    running: int = 0
    running_tokens: float = 0.0  # how far the running lines have come, in expected tokens
    rate: float | None = None  # expected tokens per second on this worker now; None: not known
    longest_s: float = 0.0  # the seconds the longest running line still needs


def worker_key(worker: str) -> str:
    """A worker's name as a field name of ``engine_progress`` (no ``.`` or ``$``)."""
    return re.sub(r"[.$]", "_", worker)


def estimate(
    remaining_lines: int,
    expected_tokens: int | None,
    reports: dict[str, Any] | None,
    line_rate: list[float] | None,
    now: float,
) -> tuple[int | None, float | None, float | None]:
    """``(estimated_completion_at, lines_per_s, tokens_per_s)`` of an in-progress batch at unix
    time ``now``: by its work when ``expected_tokens`` is known and a worker reported a rate
    within ``FRESH_S``, else by its lines (``line_rate``: ``[at, lines_per_s]``); ``(None, None,
    None)`` when neither can be told."""
    lines_per_s = round(line_rate[1], 3) if line_rate and len(line_rate) == 2 and line_rate[1] > 0 else None
    by_work = _by_work(expected_tokens, reports, now) if remaining_lines > 0 else None
    if by_work is not None:
        at, tokens_per_s = by_work
        return _whole(at), lines_per_s, round(tokens_per_s, 3)
    if lines_per_s is None or not line_rate:
        return None, None, None
    return _whole(line_rate[0] + remaining_lines / line_rate[1]), lines_per_s, None


def _by_work(
    expected_tokens: int | None, reports: dict[str, Any] | None, now: float
) -> tuple[float, float] | None:
    if not expected_tokens or not reports:
        return None
    read = [EngineProgress.model_validate(r) for r in reports.values() if isinstance(r, dict)]
    fresh = [r for r in read if now - r.at <= FRESH_S]
    rate = sum(r.rate or 0.0 for r in fresh)
    if rate <= 0:
        return None
    newest = max(r.at for r in fresh)
    done = sum(r.finished_tokens for r in read) + sum(r.running_tokens for r in fresh)
    longest = max((r.longest_s - (newest - r.at) for r in fresh), default=0.0)
    left = max(0.0, expected_tokens - done)
    return newest + max(left / rate, longest), rate


def _whole(at: float) -> int:
    return math.ceil(at)  # unix seconds, rounded up
