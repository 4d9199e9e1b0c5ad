"""The batch lifecycle: its statuses, the moves between them and the named groups of statuses.

The one owner of "which status may follow which". The batch store guards every status change
with :func:`sources` (a conditional update on the statuses the move may start from), so a racing
writer can never move a batch out of a terminal status, and a late writer loses quietly.

    validating --> in_progress --> finalizing --> completed
        |               |               |
        +--> failed     +--> expired    +--> expired
        |               |               |
        +--> cancelling <---------------+          (cancel: any open status)
                 |
                 +--> cancelled (or completed / expired / failed when that writer came first)

Moves out of ``cancelling`` to ``completed``, ``expired`` or ``failed`` exist because the writer
that ends a batch decided from what it read before the cancel landed (every line had a result,
the window had passed, the input was invalid); the batch ends as that writer found it.
"""

from __future__ import annotations

from typing import Literal, get_args

BatchStatus = Literal[
    "validating",
    "failed",
    "in_progress",
    "finalizing",
    "completed",
    "expired",
    "cancelling",
    "cancelled",
]
STATUSES: tuple[BatchStatus, ...] = get_args(BatchStatus)

TRANSITIONS: dict[BatchStatus, frozenset[BatchStatus]] = {
    "validating": frozenset({"in_progress", "failed", "cancelling", "expired"}),
    "in_progress": frozenset({"finalizing", "completed", "expired", "failed", "cancelling"}),
    "finalizing": frozenset({"completed", "expired", "cancelling"}),
    "cancelling": frozenset({"cancelled", "completed", "expired", "failed"}),
    "completed": frozenset(),
    "failed": frozenset(),
    "expired": frozenset(),
    "cancelled": frozenset(),
}

# Over for good: nothing moves a batch out of these.
TERMINAL: frozenset[BatchStatus] = frozenset(s for s, nxt in TRANSITIONS.items() if not nxt)
# Not over yet: the batch still reads its input file and may be ended by a finalize.
OPEN: frozenset[BatchStatus] = frozenset(STATUSES) - TERMINAL
# Lines were emitted and results are expected: the total is final.
RUNNING: frozenset[BatchStatus] = frozenset({"in_progress", "finalizing", "cancelling"})
# Results are being counted: live counts are written in these only.
COUNTING: frozenset[BatchStatus] = frozenset({"in_progress", "cancelling"})
# Validated batches the api's dispatcher may still send lines of (cancelling: none new; it
# watches the lines it sent come back).
DISPATCHING: frozenset[BatchStatus] = frozenset({"in_progress", "cancelling"})
# The completion window applies: past ``expires_at`` these end ``expired``.
EXPIRABLE: frozenset[BatchStatus] = frozenset({"validating", "in_progress", "finalizing"})
# A cancel request is refused (409) in these.
NOT_CANCELLABLE: frozenset[BatchStatus] = frozenset({"completed", "failed", "expired"})


class TransitionRefused(ValueError):
    """A status change the lifecycle does not allow."""


def allowed(current: str, target: str) -> bool:
    """True when a batch in ``current`` may move to ``target``."""
    return target in TRANSITIONS.get(current, frozenset())  # type: ignore[call-overload]


def sources(target: BatchStatus) -> frozenset[BatchStatus]:
    """The statuses a batch may move to ``target`` from (the guard of a conditional update)."""
    found = frozenset(s for s, nxt in TRANSITIONS.items() if target in nxt)
    if not found:
        raise TransitionRefused(f"no status moves to {target!r}")
    return found


def is_terminal(status: str) -> bool:
    return status in TERMINAL
