"""Deciding when the worker is stalled: results wait and nothing has been processed for too long.

Seen on an overloaded machine: after a restart, faust's consumer thread stopped answering
("Thread keepalive is not responding...") and the worker processed nothing for minutes while its
web page kept answering. Seen after a broker restart: the worker sat in faust's table recovery for
8+ minutes, 200 results waiting, /health 200. Nothing in faust notices either, so
``supervisor.py`` asks this class every few seconds, in every phase (table recovery, rebalance,
processing), with the backlog of the results partitions this worker actively owns; on a stall the
worker answers 503 on /health and /readyz, counts it, logs it and exits non-zero so that whatever
supervises it starts a new one (results are delivered at least once and the bitmap drops repeats,
so a restart loses and doubles nothing).

The decision is kept free of faust so a unit test can drive it with a fake clock.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping


class StallWatchdog:
    """Stalled when results have waited ``timeout_s`` with no progress by the agent meanwhile.

    ``progress()`` is called whenever the agent gets a chunk or tries to process one (a retry
    while a dependency is down is progress: /health reports the dependency, a restart would not
    help), and while table recovery reads changelog records (a long recovery is not a stall, one
    that reads nothing is). ``check(backlog)`` takes, per owned partition, how many results wait (the fetch
    high-water mark minus the committed offset), or ``None`` when the consumer has had no fetch
    answer for it yet: a consumer stuck before its first fetch must not look idle. The time is
    counted from the later of the last progress and the first check that saw results waiting, so
    work arriving after a long quiet spell is not a stall.

    An empty ``backlog`` means the worker owns no results partition. That is normal during a
    rebalance and for a worker beyond the partition count, but a restarted worker was seen to stay
    that way for minutes while its results waited; with ``unassigned_timeout_s`` > 0, owning
    nothing that long is a stall too. Once stalled, it stays stalled.
    """

    def __init__(
        self,
        timeout_s: float,
        unassigned_timeout_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.timeout_s = timeout_s
        self.unassigned_timeout_s = unassigned_timeout_s
        self._clock = clock
        self._last_progress = clock()
        self._waiting_since: float | None = None
        self._unassigned_since: float | None = None
        self.reason: str | None = None

    @property
    def stalled(self) -> bool:
        return self.reason is not None

    def progress(self) -> None:
        self._last_progress = self._clock()

    def check(self, backlog: Mapping[str, int | None], phase: str = "processing") -> str | None:
        """The stall's reason if the worker is (or was found) stalled, else ``None``.

        ``phase`` (what the worker was doing: processing, recovering, ...) only goes into the reason.
        """
        if self.reason is not None:
            return self.reason
        now = self._clock()
        if backlog:
            self._unassigned_since = None
        elif self._unassigned_since is None:
            self._unassigned_since = now
        elif self.unassigned_timeout_s > 0 and now - self._unassigned_since >= self.unassigned_timeout_s:
            self.reason = (
                f"owned no results partition for {now - self._unassigned_since:.0f} s (phase: {phase})"
            )
            return self.reason
        waiting = {name: n for name, n in backlog.items() if n is None or n > 0}
        if not waiting:
            self._waiting_since = None
            return None
        if self._waiting_since is None:
            self._waiting_since = now
        idle = now - max(self._last_progress, self._waiting_since)
        if idle < self.timeout_s:
            return None
        described = ", ".join(
            f"{name}: {'no fetch answer yet' if n is None else f'{n} waiting'}"
            for name, n in sorted(waiting.items())
        )
        self.reason = (
            f"no results processed for {idle:.0f} s while results wait ({described}; phase: {phase})"
        )
        return self.reason
