"""Running the stall watchdog in every phase, and what a stall does: 503, metric, log, exit 70.

``worker.py`` calls :meth:`StallSupervisor.tick` every ``stall_check_seconds`` from a service
that faust starts before table recovery (``faust_adapter.start_with_app``), so the check runs while
the worker rebalances, recovers its table or processes. Progress is reported by the agent (a
chunk received, or a retry of one) and, here, by table recovery reading changelog records: a
long recovery that advances is not a stall, one that reads nothing while results wait is.

Kept free of faust (the results partitions come in as :class:`ResultsView`) so a unit test drives
it with a fake clock and a fake view.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import Any, Protocol

from services.aggregator.metrics import PHASE, STALLS
from services.aggregator.watchdog import StallWatchdog

log = logging.getLogger(__name__)

STALL_EXIT_STATUS = 70  # EX_SOFTWARE


class ResultsView(Protocol):
    """What the supervisor reads of the results partitions (``faust_adapter.ResultsPartitions``)."""

    def backlog(self) -> dict[str, int | None]: ...
    def phase(self) -> str: ...
    def recovery_position(self) -> int: ...
    def describe(self) -> dict[str, dict[str, Any]]: ...


def exit_stalled_after(delay_s: float) -> None:
    """Exit with ``STALL_EXIT_STATUS`` in ``delay_s``, from a thread.

    A thread, not the loop: a graceful stop could wait on the stuck consumer forever. Nothing is
    lost: unacked results are delivered again and the bitmap drops lines already counted.
    """

    def exit_now() -> None:
        for handler in logging.getLogger().handlers:
            handler.flush()
        os._exit(STALL_EXIT_STATUS)

    timer = threading.Timer(delay_s, exit_now)
    timer.daemon = True
    timer.start()


class StallSupervisor:
    def __init__(
        self,
        watchdog: StallWatchdog,
        results: ResultsView,
        exit_delay_s: float,
        exit_after: Callable[[float], None] = exit_stalled_after,
    ) -> None:
        self.watchdog = watchdog
        self._results = results
        self._exit_delay_s = exit_delay_s
        self._exit_after = exit_after
        self._recovery_position: int | None = None
        self.phase = "unassigned"

    @property
    def reason(self) -> str | None:
        """Why the worker is stalled (it is about to exit), or ``None``."""
        return self.watchdog.reason

    def progress(self) -> None:
        """The agent got a chunk or tried to process one."""
        self.watchdog.progress()

    def tick(self) -> str | None:
        """One check; on the first stall found: count it, log it and schedule the exit."""
        if self.watchdog.stalled:
            return self.watchdog.reason
        self.phase = self._results.phase()
        PHASE.state(self.phase)
        position = self._results.recovery_position()
        if self._recovery_position is not None and position != self._recovery_position:
            self.watchdog.progress()  # table recovery read changelog records since the last tick
        self._recovery_position = position
        reason = self.watchdog.check(self._results.backlog(), self.phase)
        if reason is None:
            return None
        STALLS.inc()
        log.error(
            "aggregator stalled; exiting so that it is restarted",
            extra={
                "reason": reason,
                "phase": self.phase,
                "exit_in_s": self._exit_delay_s,
                "status": STALL_EXIT_STATUS,
                "offsets": self._results.describe(),
            },
        )
        self._exit_after(self._exit_delay_s)
        return reason
