"""The hot path, free of faust: one chunk of raw result messages in, state and chunks out.

Order per batch, which makes at-least-once delivery exactly-once in effect:
1. drop lines the state has seen (and repeats within the chunk);
2. write the new lines as one chunk object;
3. only then mark them seen and count them in the state (the faust table);
4. the caller acks the events, so faust commits their offsets after the changelog is flushed.
A crash between 2 and 3 leaves lines in a chunk but unseen: they are redelivered, written again
in another chunk, and finalize keeps one copy per line.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, MutableMapping, Sequence
from typing import Any

from pydantic import ValidationError

from services.aggregator import metrics
from services.aggregator.batches import BatchDirectory
from services.aggregator.counts import CountsFlusher
from services.aggregator.settings import AggregatorConfig
from services.aggregator.sinks import ChunkWriter, Finalizer
from services.aggregator.state import BatchState
from shared.protocol.messages import ResultMessage

log = logging.getLogger(__name__)


def decode_results(values: Iterable[bytes | None]) -> dict[str, list[ResultMessage]]:
    """Parse raw message values and group them by batch; skip what is not for the aggregator."""
    by_batch: dict[str, list[ResultMessage]] = defaultdict(list)
    for value in values:
        try:
            result = ResultMessage.from_json(value or b"")  # the body stays raw JSON
        except ValidationError as exc:
            metrics.INVALID_RESULTS.labels("undecodable").inc()
            log.warning("dropping an undecodable result", extra={"error": str(exc)[:300]})
            continue
        if result.batch_id is not None:
            by_batch[result.batch_id].append(result)
    return by_batch


class FinalizeScheduler:
    """Runs at most one finalize per batch at a time, in the background of the hot path."""

    def __init__(self, finalizer: Finalizer, concurrency: int) -> None:
        self._finalizer = finalizer
        self._slots = asyncio.Semaphore(concurrency)
        self._running: dict[str, asyncio.Task[None]] = {}

    def schedule(self, batch_id: str) -> None:
        if batch_id not in self._running:
            self._running[batch_id] = asyncio.create_task(self._run(batch_id))

    async def _run(self, batch_id: str) -> None:
        try:
            async with self._slots:
                await self._finalizer.finalize(batch_id)
        except Exception:
            # The sweep tries again; nothing is lost while the document is not terminal.
            log.exception("finalize failed", extra={"batch_id": batch_id})
        finally:
            self._running.pop(batch_id, None)

    async def drain(self, timeout_s: float) -> None:
        """Let running finalizations finish (on shutdown); cancel what remains after timeout."""
        tasks = list(self._running.values())
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=timeout_s)
        for task in pending:
            task.cancel()


class ChunkProcessor:
    def __init__(
        self,
        config: AggregatorConfig,
        *,
        states: MutableMapping[str, Any],
        directory: BatchDirectory,
        writer: ChunkWriter,
        counts: CountsFlusher,
        schedule_finalize: Callable[[str], None],
    ) -> None:
        """``config``: the sweep's ``cancel_timeout_s`` and ``sweep_batch_limit``."""
        self._states = states
        self._directory = directory
        self._writer = writer
        self._counts = counts
        self._schedule_finalize = schedule_finalize
        self._cancel_timeout_s = config.cancel_timeout_s
        self._sweep_batch_limit = config.sweep_batch_limit

    async def process(self, values: Sequence[bytes | None]) -> None:
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
        state = BatchState.from_dict(self._states.get(batch_id))
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
            self._schedule_finalize(batch_id)

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
                self._schedule_finalize(batch_id)
                due.append(batch_id)
        for batch_id in list(self._states.keys()):
            if batch_id in due or not owns(batch_id):
                continue
            state = BatchState.from_dict(self._states.get(batch_id))
            info = self._directory.cached(batch_id)
            if info is None or not info.settled:
                info = await self._directory.refresh(batch_id)
            if info is not None and (info.terminal or 0 < info.total <= state.done):
                self._schedule_finalize(batch_id)
                due.append(batch_id)
        return due
