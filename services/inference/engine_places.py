"""The engine's places: which lines run on the engine, which wait here, and which make way.

At most ``places`` lines are on the engine at once (running, or waiting inside it); the rest wait
here, in one first-in-first-out queue per group (a batch; direct requests are one group). Each
group belongs to a project (the batch's; direct requests are one project of their own), and the
places are shared by project first: a freed place goes to the project with the fewest lines on the
engine, then within it to its group with the fewest (ties: the one whose first waiter came first).
So a project's number of batches does not buy it places, and no waiting group starves behind
later arrivals: its counts only fall while it waits (beside young lines, below, the others keep
only their share).

A project's equal share is ``places`` over the projects with lines here (on the engine or
waiting), rounded up: a project with fewer lines on the engine is below its share, one with more
above it.

A young line is one of a batch's first ``young_lines`` lines here, taken while the batch holds
fewer than that; a young group has a young line on the engine and has not grown (taken a line
that was not young) since. A young line does not wait when a place is free, or when a line on a
full engine may make way for it: it goes on at once, beyond the limit, and ``victims`` names the
line that makes way: the newest of the group that is not young with the most lines on the
engine, of the project most above its share while the young line's project is below its share,
else of its own project (its head start comes out of its own project's share); with none, it
waits. While
a young group runs, its own project's other groups keep at most ``beside_young`` lines on the
engine, and while a young group's project is below its share, every project with no young group
keeps at most ``beside_young`` or its share, whichever is more: the squeeze takes no project
below its share, so a stream of one project's new batches cannot keep another project squeezed.
On a CPU each engine step costs about in proportion to the lines in it, so a new batch's lines
beside 54 others take 2.5 times as long as alone; with one project the squeeze is the whole
``beside_young``.

The places are the engine's running sequences plus the lines let wait inside it
(``engine_queue_lines``): those start the moment a sequence ends, where a line handed over by the
worker only starts once tokenized and added. A line waiting inside the engine would take the
first place that frees, whatever arrives after it: a place freed for a young line would often go
to a line that was already waiting (the abort reaches the engine before the young line is
tokenized and added). So the lines that make way are the newest on the engine, which are mostly
the ones waiting inside it (vLLM runs a batch's lines about in the order they came: a line's
priority, its ``turn``, grows with the batch's lines on the engine when it went on): beside a
young line the others keep only ``beside_young`` lines, their oldest, so nothing of theirs waits
inside the engine ahead of the young line as long as ``beside_young`` plus the young lines fit in
the running sequences (the defaults: 16 + 16 of 64).
"""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter, deque
from dataclasses import dataclass, field

from services.inference.engine import RequestAborted

# Batches whose young lines are counted (each has at most ``young_lines`` per worker).
YOUNG_BATCHES_REMEMBERED = 10_000
_GROWN = -1  # a group that is young no more

Project = str | None
"""A group's project: the batch's project, or None for the direct requests (a project of their
own, whatever a project name may be)."""


@dataclass
class _Waiter:
    arrival: int
    run_id: str
    young: bool
    project: Project
    granted: asyncio.Future[None] = field(repr=False)


@dataclass
class _Group:
    """A group's lines on the engine (run id -> young, in order of taking the place)."""

    project: Project
    runs: dict[str, bool] = field(default_factory=dict)
    young: int = 0


class EnginePlaces:
    """A per-project, then per-group, priority semaphore over the engine's places, keyed by run
    id; 0 places: no limit (and no victims)."""

    def __init__(self, places: int, young_lines: int = 0, beside_young: int | None = None) -> None:
        self.places = places
        self.young_lines = young_lines
        self.beside_young = beside_young if places else None
        self._young_taken: dict[str, int] = {}  # group -> its lines taken as young, or _GROWN
        self.used = 0
        self._groups: dict[str, _Group] = {}
        self._batches: Counter[Project] = Counter()  # project -> its groups in ``_groups``
        self._queues: dict[str, deque[_Waiter]] = {}
        self._preempted: set[str] = set()
        self._owed: list[str] = []  # lines named to make way at a young line's grant, not told yet
        self._arrivals = itertools.count()
        self._stopped = False  # a shutdown: no line takes a place any more

    @property
    def full(self) -> bool:
        return 0 < self.places <= self.used

    def running(self, group: str) -> int:
        held = self._groups.get(group)
        return len(held.runs) if held else 0

    def project_running(self, project: Project) -> int:
        """The project's lines on the engine."""
        return sum(len(held.runs) for held in self._groups.values() if held.project == project)

    def turn(self, group: str) -> int:
        """The turn of the group's newest line on the engine, for the engine's own queue (lower
        goes first): its batch's other lines on the engine, times its project's batches there
        over the fewest batches any project has there. Every project gets as many turns, spread
        over its batches: so a project's lines wait inside the engine in about the same order
        whether it runs one batch or many, a new batch's lines go ahead of a big batch's, and
        with one project a line's turn is its batch's other lines on the engine."""
        held = self._groups.get(group)
        if held is None:
            return 0
        batches = self._batches
        if len(batches) == 1:
            return len(held.runs) - 1
        return (len(held.runs) - 1) * batches[held.project] // min(batches.values())

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

    async def take(self, group: str, run_id: str, direct: bool = False, project: str = "") -> bool:
        """Take a place for the run: at once when one is free and nobody waits for it, or for a
        young line when a line may make way for it (see ``victims``); else wait. ``project`` is
        the group's (a direct request's is ignored: the direct requests are a project of their
        own). Whether the line is young (a direct request never is). Raises ``RequestAborted``
        when ``drop`` drops the group's waiters (a cancelled batch), ``CancelledError`` after
        ``stop_waiting`` (a shutdown)."""
        if self._stopped:
            raise asyncio.CancelledError
        owner: Project = None if direct else project
        young = not direct and self._take_young(group)
        if young and self.full:
            victim = self._giving_way(owner)
            if victim is not None:
                self._preempted.add(victim)
                self._owed.append(victim)
                self._grant(group, owner, run_id, young)
                return young
        elif (young and not self.full) or (not self._queues and self._may_run(group, owner)):
            self._grant(group, owner, run_id, young)
            return young
        loop = asyncio.get_running_loop()
        waiter = _Waiter(next(self._arrivals), run_id, young, owner, loop.create_future())
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
            self._batches[held.project] -= 1
            if not self._batches[held.project]:
                del self._batches[held.project]
        self._preempted.discard(run_id)
        self.used -= 1
        self._admit()

    def victims(self) -> list[str]:
        """The lines on the engine that must make way now; they count as ``preempted`` until
        given back. First those named when a young line went on a full engine (see the module's
        docstring), then the squeeze: one at a time the newest (the least work lost; mostly those
        waiting inside the engine rather than running) of the group with the most lines on the
        engine of the project most over what it may keep beside young lines. Groups with a young
        line on the engine give up none."""
        names = [r for r in self._owed if r in self._preempted]
        self._owed.clear()
        over = {p: self._others_live(p) - cap for p, cap in self._caps().items()}
        while True:
            project = max(over, key=over.__getitem__, default=None)
            if project is None or over[project] <= 0:
                break
            group = self._heaviest_other(project)
            if group is None:
                over[project] = 0
                continue
            run_id = next(r for r in reversed(self._groups[group].runs) if r not in self._preempted)
            self._preempted.add(run_id)
            names.append(run_id)
            over[project] -= 1
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

    def _project_of(self, group: str) -> Project:
        held = self._groups.get(group)
        return held.project if held is not None else self._queues[group][0].project

    def _projects_here(self) -> set[Project]:
        """The projects with lines here: on the engine or waiting for a place."""
        here = {held.project for held in self._groups.values()}
        here.update(queue[0].project for queue in self._queues.values())
        return here

    def _share(self, here: set[Project]) -> int:
        """An equal share of the places between the projects ``here``, rounded up."""
        return -(-self.places // max(1, len(here)))

    def _project_live(self) -> Counter[Project]:
        """Each project's lines on the engine that are not named to make way."""
        live: Counter[Project] = Counter()
        for group, held in self._groups.items():
            live[held.project] += self._live(group)
        return live

    def _others_live(self, project: Project) -> int:
        """The project's lines on the engine, not named to make way, of groups that are not young."""
        return sum(
            self._live(g)
            for g, held in self._groups.items()
            if held.project == project and not self._young(g)
        )

    def _heaviest_other(self, project: Project) -> str | None:
        """The project's group that is not young with the most lines on the engine not named to
        make way (None: it has none)."""
        counts = {
            g: self._live(g)
            for g, held in self._groups.items()
            if held.project == project and not self._young(g)
        }
        group = max(counts, key=counts.__getitem__, default=None)
        return group if group is not None and counts[group] else None

    def _giving_way(self, project: Project) -> str | None:
        """The line that makes way for a young line of ``project`` on a full engine: while the
        project is below its share, the newest line of the heaviest group that is not young of
        the project most above its share; else (or with none) of the project's own; None: no
        line may (the young line waits)."""
        live = self._project_live()
        share = self._share(self._projects_here() | {project})  # the project is here now
        heaviest = None
        if live[project] < share:
            above = [
                p for p in live if p != project and live[p] > share and self._heaviest_other(p) is not None
            ]
            heaviest = max(above, key=live.__getitem__, default=None)
        group = self._heaviest_other(project if heaviest is None else heaviest)
        if group is None:
            return None
        return next(r for r in reversed(self._groups[group].runs) if r not in self._preempted)

    def _caps(self) -> dict[Project, int]:
        """How many lines of its groups that are not young each project may keep on the engine
        now (a project not named: any). Only while a young group runs: its own project keeps
        ``beside_young``, and while a young group's project is below its share, a project
        without a young group keeps ``beside_young`` or its share, whichever is more."""
        if self.beside_young is None:
            return {}
        young = {held.project for group, held in self._groups.items() if self._young(group)}
        if not young:
            return {}
        caps = dict.fromkeys(young, self.beside_young)
        here = self._projects_here()
        share = self._share(here)
        live = self._project_live()
        if any(live[p] < share for p in young):
            caps.update(dict.fromkeys(here - young, max(self.beside_young, share)))
        return caps

    def _room(self) -> dict[Project, int]:
        """How many more lines of its groups that are not young each project may put on the
        engine now (a project not named: any; see ``_caps``)."""
        caps = self._caps()
        if not caps:
            return {}
        running: Counter[Project] = Counter()
        for group, held in self._groups.items():
            if not self._young(group):
                running[held.project] += len(held.runs)
        return {project: cap - running[project] for project, cap in caps.items()}

    def _may_run(self, group: str, project: Project, room: dict[Project, int] | None = None) -> bool:
        """A free place for one more line of the group (not held back beside a young line)."""
        if self.full:
            return False
        queue = self._queues.get(group)
        if self._young(group) or (queue and queue[0].young):
            return True
        left = (self._room() if room is None else room).get(project)
        return left is None or left > 0

    def _grant(self, group: str, project: Project, run_id: str, young: bool) -> None:
        held = self._groups.get(group)
        if held is None:
            held = self._groups[group] = _Group(project)
            self._batches[project] += 1
        held.runs[run_id] = young
        held.young += young
        self.used += 1

    def _admit(self) -> None:
        while self._queues:
            if self.full:
                return
            room = self._room()
            ready = [g for g in self._queues if self._may_run(g, self._project_of(g), room)]
            if not ready:
                return
            group = self._first_served(ready)
            queue = self._queues[group]
            waiter = queue.popleft()
            if not queue:
                del self._queues[group]
            if waiter.granted.done():  # cancelled, its task not resumed yet to unqueue it
                continue
            self._grant(group, waiter.project, waiter.run_id, waiter.young)
            waiter.granted.set_result(None)

    def _first_served(self, ready: list[str]) -> str:
        """Of the waiting groups that may run, the one a freed place goes to: of the project with
        the fewest lines on the engine (ties: its first waiter came first), the group with the
        fewest (ties: its first waiter came first)."""
        running: Counter[Project] = Counter()
        for held in self._groups.values():
            running[held.project] += len(held.runs)
        first: dict[Project, int] = {}
        for group in ready:
            project, arrival = self._project_of(group), self._queues[group][0].arrival
            first[project] = min(first.get(project, arrival), arrival)

        def order(group: str) -> tuple[int, int, int, int]:
            project = self._project_of(group)
            return (running[project], first[project], self.running(group), self._queues[group][0].arrival)

        return min(ready, key=order)

    def _unqueue(self, group: str, waiter: _Waiter) -> None:
        queue = self._queues.get(group)
        if queue is not None and waiter in queue:
            queue.remove(waiter)
            if not queue:
                del self._queues[group]
