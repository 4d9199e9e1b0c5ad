"""Live counts: dirty batches' request counts and usage reach MongoDB once per flush.

One ``$set`` of absolute values per batch per flush (never an increment per line), so a flush
repeated after a crash or a rebalance is harmless. Flushes run one at a time: two overlapping
flushes could land out of order and show a count going backwards for a moment.

Two callers: the agent flushes right after each chunk is counted (one bulk write per chunk, so
counts trail the results by one chunk rather than one chunk plus up to a timer period), and a
timer flushes every ``counts_flush_seconds`` whatever is still dirty (after a failed flush, or a
batch marked outside the agent).
"""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import Mapping
from typing import Any

from pymongo import UpdateOne
from pymongo.asynchronous.collection import AsyncCollection

from services.aggregator import metrics
from services.aggregator.state import BatchState

log = logging.getLogger(__name__)

LIVE_STATUSES = ["in_progress", "cancelling"]


class CountsFlusher:
    def __init__(self, batches: AsyncCollection[dict[str, Any]], states: Mapping[str, Any]) -> None:
        self._batches = batches
        self._states = states
        self._dirty: set[str] = set()
        self._lock = asyncio.Lock()

    def mark(self, batch_id: str) -> None:
        self._dirty.add(batch_id)

    @property
    def pending(self) -> int:
        return len(self._dirty)

    async def flush(self) -> int:
        """Write every dirty batch's counts in one bulk request; returns the batches written."""
        async with self._lock:
            return await self._flush()

    async def _flush(self) -> int:
        dirty, self._dirty = self._dirty, set()
        updates = [u for u in (self._update(b) for b in sorted(dirty)) if u is not None]
        if not updates:
            return 0
        try:
            await self._batches.bulk_write(updates, ordered=False)
        except Exception:
            self._dirty |= dirty  # try again at the next flush
            raise
        metrics.COUNT_UPDATES.inc(len(updates))
        return len(updates)

    def _update(self, batch_id: str) -> UpdateOne | None:
        raw = self._states.get(batch_id)
        if raw is None:  # finalized and forgotten meanwhile
            return None
        state = BatchState.from_dict(raw)
        return UpdateOne(
            {"_id": batch_id, "status": {"$in": LIVE_STATUSES}},
            {
                "$set": {
                    "request_counts.completed": state.completed,
                    "request_counts.failed": state.failed,
                    "usage": state.usage_document(),
                    # For the api's dispatcher: which lines have a result (zlib bitmap bytes).
                    "seen_lines": base64.b64decode(raw.get("seen") or ""),
                }
            },
        )
