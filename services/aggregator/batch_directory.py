"""What the aggregator reads from a batch document, cached so it is read once per batch."""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import replace

from shared.documents import BatchDocument
from shared.stores.batch_progress import BatchProgressStore, BatchSummary
from shared.stores.batches import BatchStore

log = logging.getLogger(__name__)


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
