"""Counting, the hot path, free of faust: one chunk of raw result messages in, state and chunks out.

Order per batch, which makes at-least-once delivery exactly-once in effect:
1. drop lines the state has seen (and repeats within the chunk);
2. write the new lines as one chunk object (``ChunkWriter``);
3. only then mark them seen and count them in the state (the faust table);
4. the caller acks the events, so faust commits their offsets after the changelog is flushed;
5. the live counts of the batches touched reach MongoDB (``CountsFlusher``).
A crash between 2 and 3 leaves lines in a chunk but unseen: they are redelivered, written again
in another chunk, and finalize keeps one copy per line. A batch whose every line is counted is
handed to the finalize scheduler (``finalize.py``).

Live counts: one ``$set`` of absolute values per batch per flush (never an increment per line),
so a flush repeated after a crash or a rebalance is harmless. Flushes run one at a time: two
overlapping flushes could land out of order and show a count going backwards for a moment. Two
callers: the intake flushes right after each chunk is counted (one bulk write per chunk, so counts
trail the results by one chunk rather than one chunk plus up to a timer period), and a timer
flushes every ``counts_flush_seconds`` whatever is still dirty (after a failed flush, or a batch
marked outside the agent).
"""

from __future__ import annotations

import asyncio
import base64
import logging
import secrets
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, MutableMapping, Sequence
from typing import Any

from msgspec import ValidationError

from services.aggregator import metrics
from services.aggregator.completion_rate import CompletionRates
from services.aggregator.finalize import FinalizeScheduler
from services.aggregator.settings import AggregatorConfig
from services.aggregator.state import BatchState
from shared.protocol.messages import ResultMessage, result_values
from shared.result_chunks import encode_chunk
from shared.storage import ObjectStore, result_chunk_prefix
from shared.stores.batch_progress import BatchDirectory, BatchProgressStore, LiveCounts

PROGRESS_MIN_INTERVAL_S = 1.0
"""At most one progress sample per batch per this many seconds."""
PROGRESS_AGE_DIVISOR = 300
"""... and per the batch's age divided by this (600 kept samples span most of a long batch)."""

log = logging.getLogger(__name__)


def decode_results(values: Iterable[bytes | None]) -> dict[str, list[ResultMessage]]:
    """Parse raw message values (a result, or a group of a batch's results) and group the results
    by batch; skip what is not for the aggregator."""
    by_batch: dict[str, list[ResultMessage]] = defaultdict(list)
    for value in values:
        try:
            parts = result_values(value or b"")
        except ValueError as exc:
            metrics.INVALID_RESULTS.labels("undecodable").inc()
            log.warning("dropping an undecodable result group", extra={"error": str(exc)[:300]})
            continue
        for part in parts:
            try:
                result = ResultMessage.from_json(part)  # the body stays raw JSON
            except ValidationError as exc:
                metrics.INVALID_RESULTS.labels("undecodable").inc()
                log.warning("dropping an undecodable result", extra={"error": str(exc)[:300]})
                continue
            if result.batch_id is not None:
                by_batch[result.batch_id].append(result)
    return by_batch


class ChunkProcessor:
    def __init__(
        self,
        config: AggregatorConfig,
        *,
        states: MutableMapping[str, Any],
        directory: BatchDirectory,
        writer: ChunkWriter,
        counts: CountsFlusher,
        finalize: FinalizeScheduler,
    ) -> None:
        """``config``: the sweep's ``cancel_timeout_s`` and ``sweep_batch_limit``."""
        self._states = states
        self._directory = directory
        self._writer = writer
        self._counts = counts
        self._finalize = finalize
        self._cancel_timeout_s = config.cancel_timeout_s
        self._sweep_batch_limit = config.sweep_batch_limit

    async def process(self, values: Sequence[bytes | None]) -> None:
        """Store and count one chunk's raw result values (the bucket made first)."""
        await self._writer.ensure_bucket()
        for batch_id, results in decode_results(values).items():
            await self.process_batch(batch_id, results)

    async def process_batch(self, batch_id: str, results: list[ResultMessage]) -> None:
        info = await self._directory.get(batch_id)
        if info is None:
            metrics.INVALID_RESULTS.labels("unknown_batch").inc(len(results))
            log.warning("results for an unknown batch", extra={"batch_id": batch_id})
            return
        if info.terminal:
            metrics.LATE_RESULTS_DROPPED.inc(len(results))
            return
        raw = self._states.get(batch_id)
        if raw is None and info.resumed:  # counts on from what its stored chunks gave
            stored = await self._directory.stored(batch_id)
            state = BatchState.resumed(stored) if stored is not None else BatchState()
        else:
            state = BatchState.from_dict(raw)
        fresh, duplicates, invalid = state.select_new(results, info.total)
        metrics.DUPLICATES_DROPPED.inc(duplicates)
        if invalid:
            metrics.INVALID_RESULTS.labels("bad_line").inc(invalid)
            log.warning("results with a bad line number", extra={"batch_id": batch_id})
        if not fresh:
            return
        key = await self._writer.write(batch_id, fresh)
        if self._ended_meanwhile(batch_id):
            # A finalize (expiry or cancel timeout) ended the batch during the write: its files
            # are out and its state and chunks are forgotten. Recording now would bring the
            # state back and leave this chunk behind; the lines are late, like any after the end.
            await self._writer.discard(key)
            metrics.LATE_RESULTS_DROPPED.inc(len(fresh))
            return
        state.record(fresh)
        self._states[batch_id] = state.to_dict()
        self._counts.mark(batch_id)
        ok = sum(r.succeeded for r in fresh)
        metrics.RESULTS_PROCESSED.labels("completed").inc(ok)
        metrics.RESULTS_PROCESSED.labels("failed").inc(len(fresh) - ok)
        if 0 < info.total <= state.done:
            self._finalize.schedule(batch_id)

    async def flush_counts(self) -> None:
        """Live counts to MongoDB; a failure is retried at the next flush (nothing is lost)."""
        try:
            await self._counts.flush()
        except Exception:
            log.exception("counts flush failed; retrying at the next flush")

    def _ended_meanwhile(self, batch_id: str) -> bool:
        info = self._directory.cached(batch_id)  # finalize marks it before forgetting the state
        return info is not None and info.terminal

    async def remaining(self, batch_id: str) -> int | None:
        """Lines of a running batch still without a counted result (None: unknown, no total yet)."""
        info = await self._directory.get(batch_id)
        if info is None or info.terminal or info.total <= 0:
            return None
        data = self._states.get(batch_id) or {}
        return info.total - int(data.get("completed", 0)) - int(data.get("failed", 0))

    async def sweep(self, owns: Callable[[str], bool]) -> list[str]:
        """Schedule finalize for owned batches that are due; returns their ids.

        Due: a complete state (covers a crash mid-finalize, a total that was unknown when the
        last line arrived, a finalize that failed), and overdue batch documents: expired, or
        cancelling for longer than the cancel timeout, whether or not any result ever came
        (no worker of the model may be alive). The owner of a batch is the owner of its
        results partition, so exactly one worker closes it.
        """
        due: list[str] = []
        overdue = await self._directory.overdue(time.time(), self._cancel_timeout_s, self._sweep_batch_limit)
        for batch_id in overdue:
            if owns(batch_id):
                self._finalize.schedule(batch_id)
                due.append(batch_id)
        # A resumed batch may have had every result before the broker was lost: no result will
        # come to make its state; finalize decides from its stored counts (finalize.py).
        for batch_id in await self._directory.resumed_ids():
            if batch_id not in due and batch_id not in self._states and owns(batch_id):
                self._finalize.schedule(batch_id)
                due.append(batch_id)
        for batch_id in list(self._states.keys()):
            if batch_id in due or not owns(batch_id):
                continue
            state = BatchState.from_dict(self._states.get(batch_id))
            info = self._directory.cached(batch_id)
            if info is None or not info.settled:
                info = await self._directory.refresh(batch_id)
            if info is not None and (info.terminal or 0 < info.total <= state.done):
                self._finalize.schedule(batch_id)
                due.append(batch_id)
        return due


class ChunkWriter:
    """Writes one chunk object per batch per processed chunk of results."""

    def __init__(self, store: ObjectStore) -> None:
        self._store = store
        self._bucket_ready = False

    async def ensure_bucket(self) -> None:
        if not self._bucket_ready:
            await self._store.ensure_bucket()
            self._bucket_ready = True

    async def write(self, batch_id: str, results: list[ResultMessage]) -> str:
        """Store ``results`` (sorted by line) as one object; the name sorts by write time."""
        key = f"{result_chunk_prefix(batch_id)}{time.time_ns():020d}-{secrets.token_hex(4)}.chunk"
        await self._store.put_bytes(key, encode_chunk(results))
        metrics.CHUNKS_WRITTEN.inc()
        return key

    async def discard(self, key: str) -> None:
        await self._store.delete(key)


class CountsFlusher:
    """Dirty batches' request counts and usage, written to MongoDB once per flush.

    Each write may also append a progress sample (the console's plot). Samples thin out as a batch
    ages, one per ``max(PROGRESS_MIN_INTERVAL_S, age / PROGRESS_AGE_DIVISOR)`` (age: since this
    process first counted the batch), so the kept ones span most of a long batch.
    """

    def __init__(
        self,
        batches: BatchProgressStore,
        states: Mapping[str, Any],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._batches = batches
        self._states = states
        self._dirty: set[str] = set()
        self._lock = asyncio.Lock()
        self._clock = clock
        self._sampled: dict[str, tuple[float, float]] = {}  # batch -> (first counted, last sample)
        self._rates = CompletionRates(clock=clock)  # the estimated completion time's basis

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
            self._sampled.pop(batch_id, None)
            self._rates.forget(batch_id)
            return None
        state = BatchState.from_dict(raw)
        # seen_lines: for the api's dispatcher, which lines have a result (zlib bitmap bytes).
        seen = base64.b64decode(raw.get("seen") or "")
        return LiveCounts(
            state.completed,
            state.failed,
            state.usage_document(),
            seen,
            self._sample_due(batch_id),
            self._rates.observe(batch_id, state.done),
        )

    def _sample_due(self, batch_id: str) -> bool:
        now = self._clock()
        first, last = self._sampled.get(batch_id, (now, float("-inf")))
        if now - last < max(PROGRESS_MIN_INTERVAL_S, (now - first) / PROGRESS_AGE_DIVISOR):
            self._sampled.setdefault(batch_id, (first, last))
            return False
        self._sampled[batch_id] = (first, now)
        return True
