"""The aggregator's progress in the ``batches`` collection: the few fields it reads per batch
(``BatchSummary``, cached by ``BatchDirectory`` so it is read once per batch), the live counts it
flushes, the batches that must end now, and a batch run again after a broker loss; and the
inference workers' progress on each batch's lines (``engine_progress``).

The batch's records and its status changes (``finalizing``, ``finish``) are
``shared/stores/batches.py``'s.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from pymongo import UpdateOne
from pymongo.asynchronous.collection import AsyncCollection

from shared import lifecycle
from shared.completion_estimate import FIELD as ENGINE_PROGRESS
from shared.completion_estimate import EngineProgress
from shared.documents import PROGRESS_SAMPLES, BatchDocument
from shared.stores.batches import BatchStore
from shared.stores.dispatcher import dispatch_unit

Document = dict[str, Any]


@dataclass(frozen=True)
class LiveCounts:
    """A batch's counts so far, as the aggregator flushes them."""

    completed: int
    failed: int
    usage: Mapping[str, Any]
    seen_lines: bytes | None = None  # the seen-lines bitmap, for the api's dispatcher (lost lines)
    sample: bool = True  # also append these counts to the batch's progress history
    rate: float | None = None  # lines done per second lately (``BatchDocument.completion_rate``)


@dataclass(frozen=True)
class BatchSummary:
    """The few fields the aggregator needs on its hot path (a projected read)."""

    batch_id: str
    status: str
    total: int
    project: str
    expires_at: int | None
    resumed: bool = False  # its counts restart from the stored ones (``resume``)

    @property
    def terminal(self) -> bool:
        return self.status in lifecycle.TERMINAL

    @property
    def settled(self) -> bool:
        """True when a cached copy can be trusted (total known, or the batch is over)."""
        return self.terminal or (self.status in lifecycle.RUNNING and self.total > 0)


class BatchProgressStore:
    """The aggregator's reads and writes of the ``batches`` collection (and a broker loss's
    ``resume``)."""

    def __init__(self, collection: AsyncCollection[Document]) -> None:
        self._batches = collection

    async def summary(self, batch_id: str) -> BatchSummary | None:
        projection = {"status": 1, "request_counts.total": 1, "project": 1, "expires_at": 1, "resumed": 1}
        doc = await self._batches.find_one({"_id": batch_id}, projection)
        if doc is None:
            return None
        return BatchSummary(
            batch_id=str(doc["_id"]),
            status=str(doc.get("status", "")),
            total=int((doc.get("request_counts") or {}).get("total") or 0),
            project=str(doc.get("project") or "default"),
            expires_at=doc.get("expires_at"),
            resumed=bool(doc.get("resumed")),
        )

    async def overdue(self, now: float, cancel_timeout_s: float, limit: int) -> list[str]:
        """Ids of batches that must end now although lines may lack results (expiry sweep).

        The filter form of ``services/aggregator/overdue.close_reason``, plus batches left
        ``finalizing`` for ``cancel_timeout_s`` (the finalize ends them ``completed``).
        """
        query = {
            "$or": [
                {"status": {"$in": sorted(lifecycle.EXPIRABLE)}, "expires_at": {"$lte": now}},
                {"status": "cancelling", "cancelling_at": {"$lte": now - cancel_timeout_s}},
                # The api's dispatcher saw every line it sent come back: no need to wait.
                {"status": "cancelling", "dispatch_settled": True},
                # A finalize that has not ended as long after it began lost its finalizer (an
                # aggregator whose state was reset): the batch's results are all in its chunks.
                {"status": "finalizing", "finalizing_at": {"$lte": now - cancel_timeout_s}},
            ]
        }
        cursor = self._batches.find(query, {"_id": 1}).limit(limit)
        return [str(doc["_id"]) async for doc in cursor]

    async def resumed_ids(self) -> list[str]:
        """Batches running again after a broker loss (``resume``): the aggregator's sweep checks
        those it has no state for, which may be complete already."""
        query = {"status": "in_progress", "resumed": True}
        return [str(d["_id"]) async for d in self._batches.find(query, {"_id": 1})]

    async def in_progress_ids(self) -> list[str]:
        return [str(d["_id"]) async for d in self._batches.find({"status": "in_progress"}, {"_id": 1})]

    async def live_counts(self, counts: Mapping[str, LiveCounts]) -> int:
        """Write the counts so far of many batches in one bulk request; returns the batches sent.

        Absolute values (``$set``), so a flush repeated after a crash is harmless (it may add one
        more progress sample); only batches still counting are written (a finished batch keeps its
        final counts).
        """
        if not counts:
            return 0
        guard = sorted(lifecycle.COUNTING)
        now = round(time.time(), 3)
        updates = [
            UpdateOne(
                {"_id": batch_id, "status": {"$in": guard}},
                {
                    "$set": {
                        "request_counts.completed": c.completed,
                        "request_counts.failed": c.failed,
                        "usage": dict(c.usage),
                        **({"seen_lines": c.seen_lines} if c.seen_lines is not None else {}),
                        "completion_rate": [now, c.rate] if c.rate else None,
                    },
                    # A bounded history for the progress plot, on the same write.
                    **(
                        {
                            "$push": {
                                "progress": {
                                    "$each": [[now, c.completed, c.failed]],
                                    "$slice": -PROGRESS_SAMPLES,
                                }
                            }
                        }
                        if c.sample
                        else {}
                    ),
                },
            )
            for batch_id, c in counts.items()
        ]
        await self._batches.bulk_write(updates, ordered=False)
        return len(updates)

    async def engine_progress(self, worker: str, reports: Mapping[str, EngineProgress]) -> None:
        """One inference worker's progress on each of ``reports``' batches, in one bulk write
        (``shared/completion_estimate.py``): the finished lines added, the running ones replaced;
        only batches in progress are written."""
        if not reports:
            return
        updates = []
        for batch_id, report in reports.items():
            path = f"{ENGINE_PROGRESS}.{worker}"
            state = report.model_dump(exclude={"finished_lines", "finished_tokens"})
            updates.append(
                UpdateOne(
                    {"_id": batch_id, "status": "in_progress"},
                    {
                        "$set": {f"{path}.{name}": value for name, value in state.items()},
                        "$inc": {
                            f"{path}.finished_lines": report.finished_lines,
                            f"{path}.finished_tokens": report.finished_tokens,
                        },
                    },
                )
            )
        await self._batches.bulk_write(updates, ordered=False)

    async def resume(self, batch_id: str, counts: LiveCounts) -> list[str]:
        """Run an in_progress batch again after the broker lost its messages, from what its stored
        results say (``counts``, tallied from its result chunks): the dispatcher sends only the
        lines without a result, the aggregator counts on from these counts (``resumed``). Returns
        the batch's dispatch units (``dispatch_unit``), whose positions must go."""
        doc = await self._batches.find_one_and_update(
            {"_id": batch_id, "status": "in_progress"},
            {
                "$set": {
                    "emitted": False,
                    "emitted_parts": [],
                    "resumed": True,
                    "request_counts.completed": counts.completed,
                    "request_counts.failed": counts.failed,
                    "usage": dict(counts.usage),
                    "seen_lines": counts.seen_lines or b"",
                    # The workers' reports counted lines whose results were lost, which run
                    # again: the estimate counts lines from here (shared/completion_estimate.py).
                    "expected_tokens": None,
                    ENGINE_PROGRESS: {},
                },
            },
            projection={"parts": 1, "mixed_models": 1},
        )
        parts = (doc or {}).get("parts") or ()
        if not (doc or {}).get("mixed_models"):
            return [batch_id]
        return [dispatch_unit(batch_id, i) for i in range(len(parts))]


class BatchDirectory:
    """An LRU cache of ``BatchSummary`` in front of the batch store (``batch_cache_size`` entries)."""

    def __init__(self, batches: BatchStore, progress: BatchProgressStore, max_entries: int) -> None:
        self._batches = batches
        self._progress = progress
        self._max = max_entries
        self._cache: OrderedDict[str, BatchSummary] = OrderedDict()

    async def get(self, batch_id: str) -> BatchSummary | None:
        info = self._cache.get(batch_id)
        if info is not None and info.settled:
            self._cache.move_to_end(batch_id)
            return info
        return await self.refresh(batch_id)

    async def stored(self, batch_id: str) -> BatchDocument | None:
        """The whole batch document (a resumed batch's stored counts)."""
        return await self._batches.get(batch_id)

    async def resumed_ids(self) -> list[str]:
        return await self._progress.resumed_ids()

    async def refresh(self, batch_id: str) -> BatchSummary | None:
        summary = await self._progress.summary(batch_id)
        if summary is None:
            self._cache.pop(batch_id, None)
            return None
        self._put(summary)
        return summary

    async def overdue(self, now: float, cancel_timeout_s: float, limit: int) -> list[str]:
        """Ids of batches that must end now although lines may lack results (see overdue.py)."""
        return await self._progress.overdue(now, cancel_timeout_s, limit)

    def cached(self, batch_id: str) -> BatchSummary | None:
        return self._cache.get(batch_id)

    def mark(self, batch_id: str, status: str) -> None:
        info = self._cache.get(batch_id)
        if info is not None:
            self._put(replace(info, status=status))

    def _put(self, info: BatchSummary) -> None:
        self._cache[info.batch_id] = info
        self._cache.move_to_end(info.batch_id)
        while len(self._cache) > self._max:
            self._cache.popitem(last=False)
