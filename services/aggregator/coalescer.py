"""Cutting the results stream into chunks: full, old enough, or as soon as a batch is complete.

faust's ``noack_take(n, within=s)`` yields whatever arrived every ``s`` seconds. With one fixed
window a batch's last results waited up to the whole window before they were stored and counted,
so every batch ended up to the window (then 0.5 s) after its last result (measured: 0.6-0.8 s
from the last result to ``completed`` on a 7 s batch). A shorter window alone would cut many more,
smaller chunk objects from a slow stream, and finalize reads every one of them.

So the agent takes in short polls (``chunk_poll_seconds``) and hands each poll to
``ChunkCoalescer``, which cuts a chunk when it holds ``max_lines`` events, when its oldest event
has waited ``max_age_s`` (checked on every poll and by a ticker), or at once when it holds as many
results of some batch as that batch still lacks: that batch's last lines. Results of chunks cut
but not yet in the table (the handler calls ``settled`` once a chunk is) count towards that.
Miscounting is harmless either way: duplicates make a cut come early, a chunk that never settles
(cancelled on stop) too, and a batch whose total is not known yet waits for ``max_age_s``.
Events are only gathered here; acking stays with the chunk's handler, so exactly-once in effect
is unchanged.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class ChunkCoalescer(Generic[T]):
    def __init__(
        self,
        submit: Callable[[list[T]], Awaitable[Any]],
        *,
        max_lines: int,
        max_age_s: float,
        batch_of: Callable[[T], str | None],
        remaining: Callable[[str], Awaitable[int | None]],
        clock: Callable[[], float] | None = None,
    ) -> None:
        """``batch_of(event)``: its batch id (None: none); ``remaining(batch_id)``: results the
        table still lacks (None: unknown batch, or no total yet)."""
        self._submit = submit
        self._max_lines = max_lines
        self._max_age_s = max_age_s
        self._batch_of = batch_of
        self._remaining = remaining
        self._clock = clock or asyncio.get_running_loop().time
        self._pending: list[T] = []
        self._pending_per_batch: collections.Counter[str] = collections.Counter()
        self._unsettled_per_batch: collections.Counter[str] = collections.Counter()
        self._oldest = 0.0
        self._lock = asyncio.Lock()

    @property
    def pending(self) -> int:
        return len(self._pending)

    async def add(self, events: list[T]) -> None:
        """Gather one poll's events; cut a chunk if one is due."""
        if not events:
            return
        if not self._pending:
            self._oldest = self._clock()
        self._pending.extend(events)
        batches = [b for b in map(self._batch_of, events) if b]
        self._pending_per_batch.update(batches)
        if (
            len(self._pending) >= self._max_lines
            or self._old()
            or await self._completes_a_batch(set(batches))
        ):
            await self.flush()

    async def tick(self) -> None:
        """Cut the pending events if the oldest has waited long enough (no poll comes when idle)."""
        if self._pending and self._old():
            await self.flush()

    async def flush(self) -> None:
        """Submit the pending events as one chunk (in order with earlier chunks)."""
        if not self._pending:
            return
        chunk, self._pending = self._pending, []
        self._unsettled_per_batch.update(self._pending_per_batch)
        self._pending_per_batch = collections.Counter()
        async with self._lock:  # FIFO: chunks are submitted in the order they were cut
            await self._submit(chunk)

    def settled(self, chunk: list[T]) -> None:
        """The chunk's results are in the table now (``remaining`` counts them)."""
        self._unsettled_per_batch.subtract(b for b in map(self._batch_of, chunk) if b)
        self._unsettled_per_batch = +self._unsettled_per_batch  # drop zero and negative counts

    def _old(self) -> bool:
        return self._clock() - self._oldest >= self._max_age_s

    async def _completes_a_batch(self, batch_ids: set[str]) -> bool:
        for batch_id in batch_ids:
            remaining = await self._remaining(batch_id)
            if remaining is None:
                continue
            if self._pending_per_batch[batch_id] + self._unsettled_per_batch[batch_id] >= remaining:
                return True
        return False
