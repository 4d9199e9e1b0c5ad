"""Which line runs on the engine next, and which make way: the places (``engine_places.py``) and the
aborts that carry out their decisions.

At most the engine's ``max_running`` lines run on it and ``engine_queue_lines`` more wait inside
it; the others wait here for a place: a freed place goes to the project with the fewest lines on
the engine, and within it to the batch with the fewest (direct requests count as one batch of a
project of their own). A young batch's line (one of its first ``young_batch_lines`` in the
worker) goes on at once: the newest line on the engine of the batch with the most there is
aborted to make room (mostly those waiting inside it), of another project only while the young
line's project is below its equal share of the places, else of its own; and while young lines
run the batches without one keep at most ``young_batch_others_share`` of the places (another
project never less than its equal share), so a new batch starts at once and runs nearly as fast
as alone, and no project's new batches keep another project squeezed. An aborted line waits for
a place again; a running line's work so far is lost. Direct requests are never young (they may
be aborted).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from services.inference import metrics
from services.inference.engine import Engine
from services.inference.engine_places import EnginePlaces
from services.inference.settings import InferenceSettings, worker_defaults
from shared.ids import new_id

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Place:
    """A line's place on the engine: the id of its run there and its priority."""

    run_id: str
    priority: int


class EngineScheduler:
    """Runs each line in a place on one engine; the one owner of which lines are on it."""

    def __init__(self, engine: Engine, settings: InferenceSettings | None = None) -> None:
        """Places for the engine's lines as ``settings`` size them (``engine_queue_lines`` -1:
        as many as the engine runs); without settings, their defaults."""
        settings = settings if settings is not None else worker_defaults()
        self.engine = engine
        running = engine.max_running
        queued = running if settings.engine_queue_lines < 0 else settings.engine_queue_lines
        share = settings.young_batch_others_share
        beside_young = int(running * share)
        if share > 0:
            beside_young = max(beside_young, 1)  # a small engine keeps one place for the others
        self.places = EnginePlaces(
            running and running + queued,
            settings.young_batch_lines,
            beside_young if share < 1 else None,
        )
        metrics.WAITING_FOR_PLACE.set_function(self.places.waiting)  # read at each scrape

    def running(self, batch_id: str) -> int:
        """The batch's lines on the engine."""
        return self.places.running(batch_id)

    def preempted(self, run_id: str) -> bool:
        """The run was told to make way for a young line (it should stop and is run again)."""
        return self.places.preempted(run_id)

    @asynccontextmanager
    async def place(
        self, batch_id: str | None, project: str | None = None, again: bool = False
    ) -> AsyncIterator[Place]:
        """A place on the engine for one run of a line (waits for it), given back on leaving.
        ``project`` is the batch's (a batch line that names none shares one project with the
        others that name none; a direct request's is ignored); ``again``: a run again after a
        preemption (not counted as a line started). The place's priority is vLLM's, the line's
        ``turn`` (``engine_places.py``): its batch's other lines on the engine, scaled by its project's
        batches there (its queue order for the young lines let in over the limit, and for
        ``engine_queue_lines``). A young line's place is made by aborting others (``preempted``
        says which: they should run again)."""
        group = batch_id or ""
        run_id = new_id("req_")
        young = await self.places.take(group, run_id, direct=not batch_id, project=project or "")
        if not again:
            metrics.LINES.started += 1  # handed to the engine (a run again is not counted)
        try:
            if young:
                await self._make_room()
            yield Place(run_id, self.places.turn(group))
        finally:
            self.places.give_back(group, run_id)

    async def cancel(self, batch_id: str) -> None:
        """The batch's lines waiting for a place stop waiting and those on the engine are aborted
        (each ``run`` then raises ``RequestAborted``)."""
        self.places.drop(batch_id)
        run_ids = self.places.run_ids(batch_id)
        if run_ids:
            log.info(
                "aborting a cancelled batch's requests", extra={"batch_id": batch_id, "count": len(run_ids)}
            )
        for run_id in run_ids:
            await self.engine.abort(run_id)

    def stop_waiting(self) -> None:
        """A shutdown: the lines waiting for a place leave (``run`` raises ``CancelledError``);
        the lines on the engine run on."""
        self.places.stop_waiting()

    async def _make_room(self) -> None:
        """Abort the lines on the engine that must make way for the young ones (each runs again)."""
        victims = self.places.victims()
        for done, victim in enumerate(victims):
            try:
                await self.engine.abort(victim)
            except BaseException:
                self.places.spare(victims[done:])
                raise
