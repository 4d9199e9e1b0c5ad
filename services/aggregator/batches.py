"""What the aggregator reads from a batch document, cached so it is read once per batch."""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Any

from pymongo.asynchronous.collection import AsyncCollection

from shared import lifecycle
from shared.stores.batches import BatchStore, BatchSummary

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BatchInfo:
    batch_id: str
    status: str
    total: int
    project: str
    expires_at: int | None = None

    @property
    def terminal(self) -> bool:
        return self.status in lifecycle.TERMINAL

    @property
    def settled(self) -> bool:
        """True when the cached copy can be trusted (total known, or the batch is over)."""
        return self.terminal or (self.status in lifecycle.RUNNING and self.total > 0)

    @classmethod
    def from_summary(cls, summary: BatchSummary) -> BatchInfo:
        return cls(summary.batch_id, summary.status, summary.total, summary.project, summary.expires_at)


class BatchDirectory:
    """An LRU cache of ``BatchInfo`` in front of the ``batches`` collection."""

    def __init__(self, batches: AsyncCollection[dict[str, Any]], max_entries: int = 10_000) -> None:
        self._batches = BatchStore(batches)
        self._max = max_entries
        self._cache: OrderedDict[str, BatchInfo] = OrderedDict()

    async def get(self, batch_id: str) -> BatchInfo | None:
        info = self._cache.get(batch_id)
        if info is not None and info.settled:
            self._cache.move_to_end(batch_id)
            return info
        return await self.refresh(batch_id)

    async def refresh(self, batch_id: str) -> BatchInfo | None:
        summary = await self._batches.summary(batch_id)
        if summary is None:
            self._cache.pop(batch_id, None)
            return None
        info = BatchInfo.from_summary(summary)
        self._put(info)
        return info

    async def overdue(self, now: float, cancel_timeout_s: float, limit: int) -> list[str]:
        """Ids of batches that must end now although lines may lack results (see closing.py)."""
        return await self._batches.overdue(now, cancel_timeout_s, limit)

    def cached(self, batch_id: str) -> BatchInfo | None:
        return self._cache.get(batch_id)

    def mark(self, batch_id: str, status: str) -> None:
        info = self._cache.get(batch_id)
        if info is not None:
            self._put(replace(info, status=status))

    def _put(self, info: BatchInfo) -> None:
        self._cache[info.batch_id] = info
        self._cache.move_to_end(info.batch_id)
        while len(self._cache) > self._max:
            self._cache.popitem(last=False)
