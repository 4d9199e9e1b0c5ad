"""What the aggregator reads from a batch document, cached so it is read once per batch."""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Any

from pymongo.asynchronous.collection import AsyncCollection

from services.aggregator.closing import overdue_query
from shared.protocol.openai import TERMINAL_STATUSES

log = logging.getLogger(__name__)

# Statuses in which results are expected and the total is final.
RUNNING_STATUSES = frozenset({"in_progress", "finalizing", "cancelling"})
PROJECTION = {"status": 1, "request_counts.total": 1, "project": 1, "expires_at": 1}


@dataclass(frozen=True)
class BatchInfo:
    batch_id: str
    status: str
    total: int
    project: str
    expires_at: int | None = None

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES

    @property
    def settled(self) -> bool:
        """True when the cached copy can be trusted (total known, or the batch is over)."""
        return self.terminal or (self.status in RUNNING_STATUSES and self.total > 0)

    @classmethod
    def from_document(cls, doc: dict[str, Any]) -> BatchInfo:
        counts = doc.get("request_counts") or {}
        return cls(
            batch_id=doc["_id"],
            status=str(doc.get("status", "")),
            total=int(counts.get("total") or 0),
            project=str(doc.get("project") or "default"),
            expires_at=doc.get("expires_at"),
        )


class BatchDirectory:
    """An LRU cache of ``BatchInfo`` in front of the ``batches`` collection."""

    def __init__(self, batches: AsyncCollection[dict[str, Any]], max_entries: int = 10_000) -> None:
        self._batches = batches
        self._max = max_entries
        self._cache: OrderedDict[str, BatchInfo] = OrderedDict()

    async def get(self, batch_id: str) -> BatchInfo | None:
        info = self._cache.get(batch_id)
        if info is not None and info.settled:
            self._cache.move_to_end(batch_id)
            return info
        return await self.refresh(batch_id)

    async def refresh(self, batch_id: str) -> BatchInfo | None:
        doc = await self._batches.find_one({"_id": batch_id}, PROJECTION)
        if doc is None:
            self._cache.pop(batch_id, None)
            return None
        info = BatchInfo.from_document(doc)
        self._put(info)
        return info

    async def overdue(self, now: float, cancel_timeout_s: float, limit: int) -> list[str]:
        """Ids of batches that must end now although lines may lack results (see closing.py)."""
        cursor = self._batches.find(overdue_query(now, cancel_timeout_s), {"_id": 1}).limit(limit)
        return [str(doc["_id"]) async for doc in cursor]

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
