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

from services.aggregator import metrics
from services.aggregator.state import BatchState
from shared.stores.batches import BatchStore, LiveCounts

log = logging.getLogger(__name__)


class CountsFlusher:
    def __init__(self, batches: BatchStore, states: Mapping[str, Any]) -> None:
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
        counts = {b: c for b in sorted(dirty) if (c := self._counts(b)) is not None}
        if not counts:
            return 0
        try:
            written = await self._batches.live_counts(counts)
        except Exception:
            self._dirty |= dirty  # try again at the next flush
            raise
        metrics.COUNT_UPDATES.inc(written)
        return written

    def _counts(self, batch_id: str) -> LiveCounts | None:
        raw = self._states.get(batch_id)
        if raw is None:  # finalized and forgotten meanwhile
            return None
        state = BatchState.from_dict(raw)
        # seen_lines: for the api's dispatcher, which lines have a result (zlib bitmap bytes).
        seen = base64.b64decode(raw.get("seen") or "")
        return LiveCounts(state.completed, state.failed, state.usage_document(), seen)
