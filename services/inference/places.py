"""The engine's places: which lines run on the engine, which wait here, and which make way.

At most ``places`` lines are on the engine at once (running, or waiting inside it); the rest wait
here, in one first-in-first-out queue per group (a batch; direct requests are one group). A freed
place goes to the group with the fewest lines on the engine at that moment (ties: the group whose
first waiter came first), so no waiting group starves behind later arrivals: its count only falls
while it waits (beside young lines, below, the other groups keep only their share).

A young line is one of a batch's first ``young_lines`` lines here, taken while the batch holds
fewer than that; a young group has a young line on the engine and has not grown (taken a line
that was not young) since. A young line does not wait (unless every line on the engine is a young
group's): it goes on at once, beyond the limit if need be, and ``victims`` names the lines on the
engine of the other groups that must make way. While a young
group runs, the others keep at most ``beside_young`` lines on the engine: on a CPU each engine
step costs about in proportion to the lines in it, so a new batch's lines beside 54 others take
2.5 times as long as alone.

The places are the engine's running sequences plus the lines let wait inside it
(``engine_queue_lines``): those start the moment a sequence ends, where a line handed over by the
worker only starts once tokenized and added. A line waiting inside the engine would take the
first place that frees, whatever arrives after it: a place freed for a young line would often go
to a line that was already waiting (the abort reaches the engine before the young line is
tokenized and added). So the lines that make way are the newest on the engine, which are mostly the
ones waiting inside it (vLLM runs a batch's lines about in the order they came: a line's
priority is the batch's lines on the engine when it went on): beside a young line the others
keep only ``beside_young`` lines, their oldest, so nothing of theirs waits inside the engine
ahead of the young line as long as ``beside_young`` plus the young lines fit in the running
sequences (the defaults: 16 + 16 of 64).
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from dataclasses import dataclass, field

from services.inference.engine import RequestAborted

# Batches whose young lines are counted (each has at most ``young_lines`` per worker).
YOUNG_BATCHES_REMEMBERED = 10_000
_GROWN = -1  # a group that is young no more


@dataclass
class _Waiter:
    arrival: int
    run_id: str
    young: bool
    granted: asyncio.Future[None] = field(repr=False)


@dataclass
class _Group:
    """A group's lines on the engine (run id -> young, in order of taking the place)."""

    runs: dict[str, bool] = field(default_factory=dict)
    young: int = 0


class EnginePlaces:
    """A per-group priority semaphore over the engine's places, keyed by run id; 0 places: no
    limit (and no victims)."""

    def __init__(self, places: int, young_lines: int = 0, beside_young: int | None = None) -> None:
        self.places = places
        self.young_lines = young_lines
        self.beside_young = beside_young if places else None
        self._young_taken: dict[str, int] = {}  # group -> its lines taken as young, or _GROWN
        self.used = 0
        self._groups: dict[str, _Group] = {}
        self._queues: dict[str, deque[_Waiter]] = {}
        self._preempted: set[str] = set()
        self._arrivals = itertools.count()
        self._stopped = False  # a shutdown: no line takes a place any more

    @property
    def full(self) -> bool:
        return 0 < self.places <= self.used

    def running(self, group: str) -> int:
        held = self._groups.get(group)
        return len(held.runs) if held else 0

    def run_ids(self, group: str) -> list[str]:
        held = self._groups.get(group)
        return list(held.runs) if held else []

    def holding(self, group: str) -> int:
        """The group's lines here: on the engine or waiting for a place."""
        return self.running(group) + len(self._queues.get(group, ()))

    def waiting(self) -> int:
        return sum(len(queue) for queue in self._queues.values())

    def preempted(self, run_id: str) -> bool:
        """Named by ``victims`` and still on the engine (its run should stop)."""
        return run_id in self._preempted

    async def take(self, group: str, run_id: str, direct: bool = False) -> bool:
        """Take a place for the run: at once when one is free and nobody waits for it, or for a
        young line when another group has a line to give up (see ``victims``); else wait.
        Whether the line is young (a direct request never is). Raises ``RequestAborted`` when
        ``drop`` drops the group's waiters (a cancelled batch), ``CancelledError`` after
        ``stop_waiting`` (a shutdown)."""
        if self._stopped:
            raise asyncio.CancelledError
        young = not direct and self._take_young(group)
        if (young and (not self.full or self._heaviest_other() is not None)) or (
            not self._queues and self._may_run(group)
        ):
            self._grant(group, run_id, young)
            return young
        loop = asyncio.get_running_loop()
        waiter = _Waiter(next(self._arrivals), run_id, young, loop.create_future())
        self._queues.setdefault(group, deque()).append(waiter)
        self._admit()  # free places held back for others may be this group's
        try:
            await waiter.granted
        except asyncio.CancelledError:
            granted = waiter.granted
            if granted.done() and not granted.cancelled() and granted.exception() is None:
                self.give_back(group, run_id)  # granted, but cancelled before it could run
            else:  # still queued (the task's cancellation cancelled the future), or dropped
                self._unqueue(group, waiter)
            raise
        return young

    def give_back(self, group: str, run_id: str) -> None:
        held = self._groups[group]
        if held.runs.pop(run_id):
            held.young -= 1
        if not held.runs:
            del self._groups[group]
        self._preempted.discard(run_id)
        self.used -= 1
        self._admit()

    def victims(self) -> list[str]:
        """The lines on the engine that must make way now: one at a time the newest (the least
        work lost; mostly those waiting inside the engine rather than running) of the group with
        the most lines on the engine not named yet; they count as
        ``preempted`` until given back.

        Groups with a young line on the engine give up none. The others together keep at most
        what is left of the places beside those groups' lines, and at most ``beside_young``
        while any young line runs."""
        names: list[str] = []
        for _ in range(self._excess()):
            group = self._heaviest_other()
            if group is None:
                break
            run_id = next(r for r in reversed(self._groups[group].runs) if r not in self._preempted)
            self._preempted.add(run_id)
            names.append(run_id)
        return names

    def spare(self, run_ids: list[str]) -> None:
        """Victims that could not be stopped after all: they run on."""
        self._preempted.difference_update(run_ids)

    def stop_waiting(self) -> None:
        """Every waiter stops waiting, and no line takes a place any more: ``take`` raises
        ``CancelledError`` (a shutdown; the lines on the engine run on)."""
        self._stopped = True
        for queue in self._queues.values():
            for waiter in queue:
                waiter.granted.cancel()

    def drop(self, group: str) -> None:
        """The group's waiters stop waiting: their ``take`` raises ``RequestAborted``."""
        for waiter in self._queues.pop(group, ()):
            if not waiter.granted.done():  # not cancelled meanwhile (its task unqueues it)
                waiter.granted.set_exception(RequestAborted(group))

    def _take_young(self, group: str) -> bool:
        """Whether the group's next line is young (counted: at most ``young_lines`` per group)."""
        taken = self._young_taken.pop(group, 0)
        young = taken != _GROWN and taken < self.young_lines and self.holding(group) < self.young_lines
        self._young_taken[group] = taken + 1 if young else _GROWN  # now the most recent
        while len(self._young_taken) > YOUNG_BATCHES_REMEMBERED:
            del self._young_taken[next(iter(self._young_taken))]  # the least recent group
        return young

    def _young(self, group: str) -> bool:
        held = self._groups.get(group)
        return held is not None and held.young > 0 and self._young_taken.get(group) != _GROWN

    def _live(self, group: str) -> int:
        return sum(1 for r in self._groups[group].runs if r not in self._preempted)

    def _others(self) -> list[str]:
        """Groups on the engine that are not young."""
        return [g for g in self._groups if not self._young(g)]

    def _heaviest_other(self) -> str | None:
        counts = {g: self._live(g) for g in self._others()}
        group = max(counts, key=counts.__getitem__, default=None)
        return group if group is not None and counts[group] else None

    def _others_allowed(self) -> int | None:
        """How many lines the groups without a young line may keep on the engine (None: any)."""
        if not self.places:
            return None
        young_groups = sum(len(self._groups[g].runs) for g in self._groups if self._young(g))
        allowed = self.places - young_groups
        if young_groups and self.beside_young is not None:
            allowed = min(allowed, self.beside_young)
        return max(allowed, 0)

    def _excess(self) -> int:
        allowed = self._others_allowed()
        if allowed is None:
            return 0
        return max(0, sum(self._live(g) for g in self._others()) - allowed)

    def _may_run(self, group: str) -> bool:
        """A free place for one more line of the group (not held back beside a young line)."""
        if self.full:
            return False
        queue = self._queues.get(group)
        if self._young(group) or (queue and queue[0].young):
            return True
        allowed = self._others_allowed()
        return allowed is None or sum(len(self._groups[g].runs) for g in self._others()) < allowed

    def _grant(self, group: str, run_id: str, young: bool) -> None:
        held = self._groups.setdefault(group, _Group())
        held.runs[run_id] = young
        held.young += young
        self.used += 1

    def _admit(self) -> None:
        while self._queues:
            ready = [g for g in self._queues if self._may_run(g)]
            if not ready:
                return
            group = min(ready, key=lambda g: (self.running(g), self._queues[g][0].arrival))
            queue = self._queues[group]
            waiter = queue.popleft()
            if not queue:
                del self._queues[group]
            if waiter.granted.done():  # cancelled, its task not resumed yet to unqueue it
                continue
            self._grant(group, waiter.run_id, waiter.young)
            waiter.granted.set_result(None)

    def _unqueue(self, group: str, waiter: _Waiter) -> None:
        queue = self._queues.get(group)
        if queue is not None and waiter in queue:
            queue.remove(waiter)
            if not queue:
                del self._queues[group]
