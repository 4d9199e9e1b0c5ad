"""Which batch's lines go next: a pure planner, fed the queue and a budget, with no I/O.

Many projects share one model, so nothing one project sets may take another's share; only the
operator orders projects. A round's budget goes, in this order:

1. **Head starts**: a batch that has not started gets its first lines (a small batch starts, and at
   10 lines is wholly sent, within one round whatever is queued), but one project's new batches
   share ``start_lines`` per round between them, charged to the project's virtual time, and a
   project more than one head start ahead of its tier's lowest virtual time gets none: a project
   sending many small batches gets no more than its share.
2. **Tiers**, which only the operator grants (``project_tiers``, default 0): a higher tier's
   projects are served before a lower tier's. Within a tier:
3. **Batches at risk** (``QueuedBatch.at_risk``, computed by the loop with ``at_risk``): a batch
   whose remaining lines, at the rate it can count on, would not be done ``deadline_margin_s``
   before its ``expires_at``, goes ahead of the fair share, earliest deadline first, charged to its
   project. A deadline orders nothing else: every batch has a 24 h window, so ordering by deadline
   would only replay creation order and let whoever came first take the model.
4. **Weighted fair share between projects**: each project has a virtual time that grows by
   ``lines / weight`` as it is served, the project with the lowest goes next, ``quantum`` lines at a
   time; a project that joins (new, or back after having nothing queued, or waiting until then
   behind a higher tier) first moves up to the lowest virtual time of the tier's projects that
   stayed queued, so idling banks no credit and a newcomer does not catch up on what the others
   were sent before it came.
5. **Within a project**: its batches' ``priority`` (higher first, strictly), round robin between
   batches of one priority. A batch's priority orders only its own project's batches.

Batches past their deadline get nothing: their lines become ``batch_expired`` at finalize. One
policy plans one model's queue: the virtual times are per model, so a project's use of one model
does not lower its share of another.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

RATE_WINDOW_S = 60.0
"""A batch's own send rate (``SendRate``) is measured over about this many seconds of its sends."""


@dataclass(frozen=True)
class QueuedBatch:
    batch_id: str
    project: str
    remaining: int  # request lines not dispatched yet
    priority: int = 0  # orders this project's batches only
    expires_at: float = float("inf")
    started: bool = False  # any line dispatched already
    order: int = 0  # creation order (sort_key): ties and round-robin order
    at_risk: bool = False  # would miss its deadline at its rate (``at_risk``): goes ahead in its tier


@dataclass(frozen=True)
class Lineup:
    """One round's queue as the policy serves it (``FairSharePolicy.lineup``)."""

    tiers: list[list[QueuedBatch]]  # the live batches by their project's tier, highest first
    starting: list[list[QueuedBatch]]  # the new batches that get a head start, by project
    head_start_lines: int  # lines those head starts take (the loop's budget covers them always)


@dataclass(frozen=True)
class Grant:
    batch_id: str
    lines: int


def at_risk(
    remaining: int, own_rate: float, capacity: float, queued: int, time_left: float, margin_s: float
) -> bool:
    """Whether a batch with ``time_left`` seconds to its deadline is at risk of missing it.

    At risk: its ``remaining`` lines, at the rate it can count on, would not be done ``margin_s``
    before the deadline, or the deadline is within ``margin_s`` already. The rate it can count on
    is the higher of its own (``own_rate``, lines sent per second: ``SendRate``) and an equal share
    of the model's rate (``capacity``, lines the workers commit per second) between the model's
    ``queued`` batches: its own alone would read a batch that only waits its turn (behind a higher
    tier, or its project's higher priority) as at risk, the share alone a batch served faster than
    that as slower than it is. With neither rate known, only the margin counts. A batch that the
    model's whole rate could not finish in time is not at risk: going first cannot save it, and it
    would only hold up the other projects until it expires.
    """
    if remaining <= 0 or time_left <= 0:
        return False
    if capacity > 0 and remaining > capacity * time_left:
        return False
    if time_left <= margin_s:
        return True
    rate = max(own_rate, capacity / queued if queued > 0 else 0.0)
    return rate > 0 and remaining > rate * (time_left - margin_s)


@dataclass
class SendRate:
    """Lines of one batch sent per second over about the last ``window_s`` seconds."""

    window_s: float = RATE_WINDOW_S
    _marks: deque[tuple[float, int]] = field(default_factory=deque)

    def mark(self, now: float, sent: int) -> None:
        """The batch had sent ``sent`` lines in all at ``now`` (one mark per eighth of a window)."""
        if not self._marks or now - self._marks[-1][0] >= self.window_s / 8:
            self._marks.append((now, sent))
        while len(self._marks) > 1 and self._marks[1][0] <= now - self.window_s:
            self._marks.popleft()

    def per_second(self, now: float, sent: int) -> float:
        """The rate since the oldest mark in the window; 0 until a quarter window was seen."""
        if not self._marks or now - self._marks[0][0] < self.window_s / 4:
            return 0.0
        since, then = self._marks[0]
        return max(0, sent - then) / (now - since)


@dataclass
class FairSharePolicy:
    weights: dict[str, float] = field(default_factory=dict)
    default_weight: float = 1.0
    tiers: dict[str, int] = field(default_factory=dict)  # the operator's grants; 0 if not named
    quantum: int = 16
    start_lines: int = 32
    _virtual: dict[str, float] = field(default_factory=dict)
    _last_served: dict[str, tuple[int, str]] = field(default_factory=dict)
    _reached: set[str] = field(default_factory=set)  # projects of the tiers the last plan shared

    def weight(self, project: str) -> float:
        return self.weights.get(project, self.default_weight)

    def tier(self, project: str) -> int:
        return self.tiers.get(project, 0)

    def lineup(self, queued: Sequence[QueuedBatch], now: float) -> Lineup:
        """The round's queue as ``plan`` serves it: its live batches by tier (their projects
        levelled, ``_level``) and the new batches that get a head start. Made once a round,
        before any line of it is charged; one ``plan`` per lineup."""
        live = [b for b in queued if b.remaining > 0 and b.expires_at > now]
        tiers = self._tiers(live)
        self._level(tiers)
        starting = self._starting(live)
        return Lineup(
            tiers=tiers,
            starting=starting,
            head_start_lines=sum(
                min(sum(b.remaining for b in batches), self.start_lines) for batches in starting
            ),
        )

    def plan(self, lineup: Lineup, budget: int) -> list[Grant]:
        """Split ``budget`` lines between the lineup's batches, in the order they should be sent."""
        granted: dict[str, int] = {}
        left = self._head_starts(lineup.starting, granted, budget)
        # Head starts taking the whole round leave the share with the top tier: its projects
        # wait behind new batches, not behind a higher tier, and keep their place.
        tiers = lineup.tiers
        self._reached = {b.project for b in tiers[0]} if tiers and left <= 0 else set()
        for tier in tiers:
            if left <= 0:
                break
            self._reached |= {b.project for b in tier}
            left = self._rescue(tier, granted, left)
            left = self._share(tier, granted, left)
        return [Grant(batch_id, lines) for batch_id, lines in granted.items() if lines > 0]

    def _starting(self, live: list[QueuedBatch]) -> list[list[QueuedBatch]]:
        """The new batches that get a head start, one list per project (higher priority, then
        older, first), projects in tier, then virtual time, order. A project more than one head
        start (``start_lines`` over its weight) ahead of the lowest virtual time of its tier's
        queued projects gets none: its new batches wait for its share like any line, so a
        project creating batches all the time is not served beyond its share by their head
        starts (which the loop's budget covers whatever the backlog)."""
        lowest: dict[int, float] = {}
        for batch in live:
            tier, virtual = self.tier(batch.project), self._virtual.get(batch.project, 0.0)
            lowest[tier] = min(lowest.get(tier, virtual), virtual)
        new: dict[str, list[QueuedBatch]] = {}
        for batch in sorted(live, key=lambda b: (-b.priority, b.order, b.batch_id)):
            if batch.started:
                continue
            project = batch.project
            ahead = self._virtual.get(project, 0.0) - lowest[self.tier(project)]
            if ahead <= self.start_lines / self.weight(project):
                new.setdefault(project, []).append(batch)
        order = sorted(new, key=lambda p: (-self.tier(p), self._virtual.get(p, 0.0), p))
        return [new[project] for project in order]

    def _head_starts(self, starting: list[list[QueuedBatch]], granted: dict[str, int], left: int) -> int:
        """Each project's new batches share ``start_lines``, evenly (higher priority, then older,
        first when lines are fewer than batches)."""
        for batches in starting:
            for batch, lines in zip(batches, _fill(min(self.start_lines, left), batches), strict=True):
                if lines > 0:
                    granted[batch.batch_id] = lines
                    self._charge(batch, lines)
                    left -= lines
        return left

    def _rescue(self, tier: list[QueuedBatch], granted: dict[str, int], left: int) -> int:
        """The tier's batches at risk of missing their deadline, earliest deadline first."""
        for batch in sorted(tier, key=lambda b: (b.expires_at, b.order, b.batch_id)):
            if left <= 0:
                break
            if batch.at_risk and _room(batch, granted) > 0:
                lines = min(left, _room(batch, granted))
                granted[batch.batch_id] = granted.get(batch.batch_id, 0) + lines
                self._charge(batch, lines)
                left -= lines
        return left

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

    def _tiers(self, live: list[QueuedBatch]) -> list[list[QueuedBatch]]:
        """The queued batches by their project's tier, highest first."""
        tiers: dict[int, list[QueuedBatch]] = {}
        for batch in live:
            tiers.setdefault(self.tier(batch.project), []).append(batch)
        return [tiers[t] for t in sorted(tiers, reverse=True)]

    def _level(self, tiers: list[list[QueuedBatch]]) -> None:
        """Projects joining a tier's share start level with those that stayed in it.

        Done before any line of the round is charged (a new batch's head start included). A
        project stays if the last plan's fair share reached its tier; any other (new, back from
        having nothing queued, or waiting behind a higher tier) joins: it moves up to the lowest
        virtual time of those staying, or, if none stays, the tier's projects start level at the
        highest of theirs (it never goes down). So what a project was sent before the other
        arrived is not caught up on, and the split does not depend on whether head starts were
        granted in between.
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
        """The project's highest priority; round robin between its batches of that priority (the
        batch after the one this project served last, in creation order)."""
        top = max(b.priority for b in batches)
        batches = [b for b in batches if b.priority == top]
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


def _room(batch: QueuedBatch, granted: dict[str, int]) -> int:
    return batch.remaining - granted.get(batch.batch_id, 0)


def _fill(total: int, batches: list[QueuedBatch]) -> list[int]:
    """``total`` lines split evenly between ``batches``, none above its remaining lines; when
    lines are fewer than batches, the first batches get one each."""
    lines = [0] * len(batches)
    open_ = [i for i, b in enumerate(batches) if b.remaining > 0]
    while total > 0 and open_:
        each = max(1, total // len(open_))
        for i in list(open_):
            take = min(each, batches[i].remaining - lines[i], total)
            lines[i] += take
            total -= take
            if lines[i] >= batches[i].remaining:
                open_.remove(i)
            if total <= 0:
                break
    return lines
