"""Which batch's lines go next: a pure planner, fed the queue and a budget, with no I/O.

The order:
1. ``priority`` (higher first; strict);
2. the earliest deadline (``expires_at``): batches whose deadlines lie within
   ``deadline_resolution_s`` of the earliest one form a tier, served before later tiers (every batch
   has a 24 h window, so exact deadlines would only replay creation order: a tier is "about as
   urgent");
3. weighted fair share between the projects of a tier: each project has a virtual time that grows
   by ``lines / weight`` as it is served, the project with the lowest goes next, ``quantum_lines``
   at a time; a project that joins (new, or back after having nothing queued) first moves up to
   the lowest virtual time of the tier's projects that stayed queued, so idling banks no credit
   and a newcomer does not catch up on what the others were sent before it came;
4. round robin between the batches of one project.

Before that order, a batch that has not started yet gets up to ``start_lines`` lines in its first
round, so a small batch starts (and, at 10 lines, is wholly sent) within one round whatever is
queued (charged to its project like any line). Batches past their deadline get nothing: their
lines become ``batch_expired`` at finalize. One policy plans one model's queue: the virtual times
are per model, so a project's use of one model does not lower its share of another.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class QueuedBatch:
    batch_id: str
    project: str
    remaining: int  # request lines not dispatched yet
    priority: int = 0
    expires_at: float = float("inf")
    started: bool = False  # any line dispatched already
    order: int = 0  # creation order (sort_key): ties and round-robin order


@dataclass(frozen=True)
class Grant:
    batch_id: str
    lines: int


@dataclass
class FairSharePolicy:
    weights: dict[str, float] = field(default_factory=dict)
    default_weight: float = 1.0
    quantum: int = 16
    start_lines: int = 32
    deadline_resolution_s: float = 600.0
    _virtual: dict[str, float] = field(default_factory=dict)
    _last_served: dict[str, tuple[int, str]] = field(default_factory=dict)
    _reached: set[str] = field(default_factory=set)  # projects of the tiers the last plan shared

    def weight(self, project: str) -> float:
        return self.weights.get(project, self.default_weight)

    def plan(self, queued: Sequence[QueuedBatch], budget: int, now: float) -> list[Grant]:
        """Split ``budget`` lines between the queued batches, in the order they should be sent."""
        live = [b for b in queued if b.remaining > 0 and b.expires_at > now]
        tiers = _tiers(live, self.deadline_resolution_s)
        self._level(tiers)
        granted: dict[str, int] = {}
        left = budget
        for batch in sorted(live, key=_urgency):
            if left <= 0:
                break
            if not batch.started:
                lines = min(batch.remaining, self.start_lines, left)
                granted[batch.batch_id] = lines
                self._charge(batch, lines)
                left -= lines
        self._reached = set()
        for tier in tiers:
            if left <= 0:
                break
            self._reached |= {b.project for b in tier}
            left = self._share(tier, granted, left)
        return [Grant(batch_id, lines) for batch_id, lines in granted.items() if lines > 0]

    def _share(self, tier: list[QueuedBatch], granted: dict[str, int], left: int) -> int:
        by_project: dict[str, list[QueuedBatch]] = {}
        for batch in sorted(tier, key=lambda b: (b.order, b.batch_id)):
            by_project.setdefault(batch.project, []).append(batch)
        while left > 0:
            open_projects = [
                p for p, batches in by_project.items() if any(_room(b, granted) for b in batches)
            ]
            if not open_projects:
                break
            project = min(open_projects, key=lambda p: (self._virtual[p], p))
            batch = self._next_batch(project, [b for b in by_project[project] if _room(b, granted)])
            lines = min(self.quantum, left, _room(batch, granted))
            granted[batch.batch_id] = granted.get(batch.batch_id, 0) + lines
            self._charge(batch, lines)
            left -= lines
        return left

    def _level(self, tiers: list[list[QueuedBatch]]) -> None:
        """Projects joining a tier start level with those that stayed in the share.

        Done before any line of the round is charged (a new batch's start lines included). A
        project stays if the last plan's fair share reached a tier it had lines in; any other
        (new, back from having nothing queued, or waiting behind a higher priority or an earlier
        deadline) joins: it moves up to the lowest virtual time of those staying, or, if none
        stays, the tier's projects start level at the highest of theirs (it never goes down). So
        what a project was sent in another tier, or before the other arrived, is not caught up
        on, and the split does not depend on whether start lines were granted in between.
        """
        for tier in tiers:
            projects = {b.project for b in tier}
            staying = projects & self._reached
            if staying:
                floor = min(self._virtual.get(p, 0.0) for p in staying)
            else:
                floor = max((self._virtual.get(p, 0.0) for p in projects), default=0.0)
            for project in projects - staying:
                self._virtual[project] = max(self._virtual.get(project, floor), floor)

    def _next_batch(self, project: str, batches: list[QueuedBatch]) -> QueuedBatch:
        """Round robin: the batch after the one this project served last, in creation order."""
        last = self._last_served.get(project)
        if last is not None:
            for batch in batches:  # sorted by (order, batch_id)
                if (batch.order, batch.batch_id) > last:
                    return batch
        return batches[0]

    def _charge(self, batch: QueuedBatch, lines: int) -> None:
        weight = self.weight(batch.project)
        self._virtual[batch.project] = self._virtual.get(batch.project, 0.0) + lines / weight
        self._last_served[batch.project] = (batch.order, batch.batch_id)

    def forget(self, projects_seen: set[str]) -> None:
        """Drop state of projects no longer queued (bounded memory)."""
        for name in [p for p in self._virtual if p not in projects_seen]:
            self._virtual.pop(name, None)
            self._last_served.pop(name, None)


def _urgency(batch: QueuedBatch) -> tuple[int, float, int, str]:
    return (-batch.priority, batch.expires_at, batch.order, batch.batch_id)


def _room(batch: QueuedBatch, granted: dict[str, int]) -> int:
    return batch.remaining - granted.get(batch.batch_id, 0)


def _tiers(batches: list[QueuedBatch], resolution_s: float) -> list[list[QueuedBatch]]:
    """Priority levels (highest first), each cut into deadline tiers (earliest first)."""
    tiers: list[list[QueuedBatch]] = []
    current: list[QueuedBatch] = []
    for batch in sorted(batches, key=_urgency):
        if current and (
            batch.priority != current[0].priority or batch.expires_at >= current[0].expires_at + resolution_s
        ):
            tiers.append(current)
            current = []
        current.append(batch)
    if current:
        tiers.append(current)
    return tiers
