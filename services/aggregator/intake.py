"""Intake: the results agent's polls cut into chunks, each counted in the background, acked once stored.

The agent hands every short poll to ``ResultsIntake.add``. ``ChunkCoalescer`` decides where a
chunk ends; ``ResultsIntake`` starts each chunk in the background while the next one is collected,
has counting store and count it (``counting.ChunkProcessor``), acks its events on the stream, and
has the live counts flushed. A chunk's events are acked only once its results are stored and
counted: a chunk cut short by a crash, an error or SIGTERM is never acked, so its offsets are never
committed and it is delivered again. While a dependency is down a chunk is retried (exponential
backoff with jitter, tenacity), never dropped.

Cutting chunks. faust's ``noack_take(n, within=s)`` yields whatever arrived every ``s`` seconds.
With one fixed window a batch's last results waited up to the whole window before they were stored
and counted, so every batch ended up to the window (then 0.5 s) after its last result (measured:
0.6-0.8 s from the last result to ``completed`` on a 7 s batch). A shorter window alone would cut
many more, smaller chunk objects from a slow stream, and finalize reads every one of them. So the
agent takes in short polls (``chunk_poll_seconds``) and the coalescer cuts a chunk when it holds
``chunk_lines`` results, when its oldest event has waited ``chunk_seconds`` (checked on every poll
and by a ticker), or at once when it holds as many results of some batch as that batch still
lacks: that batch's last lines. Results of chunks cut but not yet in the table (``settled`` is
called once a chunk is) count towards that. Miscounting is harmless either way: duplicates make a
cut come early, a chunk that never settles (cancelled on stop) too, and a batch whose total is not
known yet waits for ``chunk_seconds``.

One chunk in flight. faust's ``noack_take`` stops filling its buffer while the agent's loop body
runs. A body that decodes a chunk, writes its object and updates the table before asking for the
next one leaves the consumer idle all that time: at ~8,000 results/s the aggregator spent ~0.5 s
collecting and ~0.3 s processing per chunk, moved ~6,000 lines/s and fell seconds behind the
results. So a chunk is handled by one background task and the body returns at once, so the next
chunk fills while this one is stored. At most one chunk is in flight: a new chunk first waits until
the previous chunk's task has finished (stored, counted and acked), so chunks are processed and
acked in the order they were cut, each one against a bitmap that already holds every earlier
chunk. A cancelled task acks nothing and its lines come again.

Free of faust: events are anything with ``value`` and ``message.key``/``message.timestamp``
(faust's ``EventT``), and the stream anything with an ``ack(event)`` (faust's ``Stream``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, Generic, Protocol, TypeVar

from tenacity import AsyncRetrying, RetryCallState, wait_exponential_jitter

from services.aggregator import metrics
from services.aggregator.counting import ChunkProcessor
from services.aggregator.settings import AggregatorConfig
from services.aggregator.supervisor import StallSupervisor
from shared.protocol.messages import result_count

log = logging.getLogger(__name__)

RETRY_FIRST_S = 0.2
RETRY_MAX_S = 5.0


class ResultEvent(Protocol):
    @property
    def value(self) -> Any: ...
    @property
    def message(self) -> Any: ...  # with ``key`` (bytes) and ``timestamp`` (Kafka's, seconds)


E = TypeVar("E", bound=ResultEvent)
E_contra = TypeVar("E_contra", bound=ResultEvent, contravariant=True)


class EventStream(Protocol[E_contra]):
    """Where the events came from: acking an event lets faust commit its offset."""

    async def ack(self, event: E_contra) -> Any: ...


def batch_of(event: ResultEvent) -> str | None:
    """Workers key a batch's results by its id (direct requests' results go to reply topics)."""
    key = event.message.key
    return key.decode(errors="replace") if isinstance(key, bytes) else None


def results_in(event: ResultEvent) -> int:
    """The results the event's message holds (a worker sends a batch's results in groups)."""
    return result_count(getattr(event.message, "headers", None))


def _per_batch(events: Sequence[ResultEvent]) -> collections.Counter[str]:
    counts: collections.Counter[str] = collections.Counter()
    for event in events:
        batch_id = batch_of(event)
        if batch_id:
            counts[batch_id] += results_in(event)
    return counts


class ResultsIntake(Generic[E]):
    def __init__(
        self,
        config: AggregatorConfig,
        *,
        stream: EventStream[E],
        processor: ChunkProcessor,
        stall_check: StallSupervisor,
        retry_first_s: float = RETRY_FIRST_S,
        retry_max_s: float = RETRY_MAX_S,
    ) -> None:
        """``config``: ``chunk_lines``, ``chunk_seconds`` and the ticker's ``chunk_poll_seconds``;
        ``stall_check`` hears of every poll and attempt (the agent is alive)."""
        self._stream = stream
        self._processor = processor
        self._stall_check = stall_check
        self._tick_s = config.chunk_poll_seconds
        self._retry_first_s = retry_first_s
        self._retry_max_s = retry_max_s
        self._coalescer: ChunkCoalescer[E] = ChunkCoalescer(
            processor, max_lines=config.chunk_lines, max_age_s=config.chunk_seconds
        )
        self._in_flight: asyncio.Task[None] | None = None
        self._order = asyncio.Lock()

    async def add(self, events: list[E]) -> None:
        """One poll's events (possibly none)."""
        self._stall_check.progress()
        if events:
            _observe_ages("polled", events)
        chunk = await self._coalescer.add(events)
        if chunk:
            await self._start(chunk)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Cut old chunks every ``chunk_poll_seconds`` (no poll comes when idle); abandon the chunk
        in flight on exit (unacked, it is delivered again)."""
        ticker = asyncio.create_task(self._tick_forever())
        try:
            yield
        finally:
            ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ticker
            task, self._in_flight = self._in_flight, None
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def process_until_done(self, values: Sequence[bytes | None]) -> None:
        """Retry a chunk while a dependency is down; lines already counted are dropped on retry."""
        retrying = AsyncRetrying(
            wait=wait_exponential_jitter(
                multiplier=self._retry_first_s, jitter=self._retry_first_s, max=self._retry_max_s
            ),
            before_sleep=_log_retry,
        )
        async for attempt in retrying:
            with attempt:
                self._stall_check.progress()  # a retry is progress: /readyz reports the dependency
                await self._processor.process(values)

    async def _start(self, chunk: list[E]) -> None:
        """Handle ``chunk`` in the background once the chunk in flight is done (its errors
        propagate here); chunks start in the order they were cut."""
        async with self._order:  # FIFO: a ticker's cut and a poll's cut keep their order
            loop = asyncio.get_running_loop()
            started = loop.time()
            task, self._in_flight = self._in_flight, None
            if task is not None:
                await task
            self._in_flight = asyncio.create_task(self._handle(chunk))
            waited = loop.time() - started
        if waited > 0.001:
            log.debug("chunk waited for the previous one", extra={"seconds": round(waited, 4)})

    async def _handle(self, events: list[E]) -> None:
        started = time.perf_counter()
        oldest = _observe_ages("chunk_started", events)
        await self.process_until_done([event.value for event in events])
        for event in events:
            await self._stream.ack(event)
        self._coalescer.settled(events)
        await self._processor.flush_counts()  # counts reach MongoDB right after a chunk
        seconds = time.perf_counter() - started
        metrics.CHUNK_SECONDS.observe(seconds)
        log.debug(
            "chunk processed",
            extra={
                "events": len(events),
                "seconds": round(seconds, 4),
                # Since the oldest event's Kafka timestamp: how far behind the results we are.
                "behind_s": round(time.time() - oldest, 3),
            },
        )

    async def _tick_forever(self) -> None:
        while True:
            await asyncio.sleep(self._tick_s)
            try:
                chunk = self._coalescer.tick()
                if chunk:
                    await self._start(chunk)
            except Exception:
                log.exception("cutting an old chunk failed; retrying at the next tick")


class ChunkCoalescer(Generic[E]):
    """Gathers polls and says when a chunk is cut: full, old enough, or a batch's last lines.

    Events are only gathered here; acking stays with the chunk's handler, so exactly-once in effect
    is unchanged.
    """

    def __init__(
        self,
        processor: ChunkProcessor,
        *,
        max_lines: int,
        max_age_s: float,
        clock: Callable[[], float] | None = None,
    ) -> None:
        """``processor.remaining(batch_id)``: results the table still lacks (None: unknown batch,
        or no total yet)."""
        self._processor = processor
        self._max_lines = max_lines
        self._max_age_s = max_age_s
        self._clock = clock or asyncio.get_running_loop().time
        self._pending: list[E] = []
        self._pending_results = 0  # results in the pending events
        self._pending_per_batch: collections.Counter[str] = collections.Counter()
        self._unsettled_per_batch: collections.Counter[str] = collections.Counter()
        self._oldest = 0.0

    @property
    def pending(self) -> int:
        return len(self._pending)

    async def add(self, events: list[E]) -> list[E] | None:
        """Gather one poll's events; returns the chunk cut, if one is due."""
        if not events:
            return None
        if not self._pending:
            self._oldest = self._clock()
        self._pending.extend(events)
        added = _per_batch(events)
        self._pending_per_batch.update(added)
        self._pending_results += sum(map(results_in, events))
        if (
            self._pending_results >= self._max_lines
            or self._old()
            or await self._completes_a_batch(set(added))
        ):
            return self.cut()
        return None

    def tick(self) -> list[E] | None:
        """The pending events as a chunk if the oldest has waited long enough (no poll comes when
        idle)."""
        if self._pending and self._old():
            return self.cut()
        return None

    def cut(self) -> list[E] | None:
        """The pending events as one chunk (None: nothing pending)."""
        if not self._pending:
            return None
        chunk, self._pending = self._pending, []
        self._pending_results = 0
        self._unsettled_per_batch.update(self._pending_per_batch)
        self._pending_per_batch = collections.Counter()
        return chunk

    def settled(self, chunk: list[E]) -> None:
        """The chunk's results are in the table now (``remaining`` counts them)."""
        self._unsettled_per_batch.subtract(_per_batch(chunk))
        self._unsettled_per_batch = +self._unsettled_per_batch  # drop zero and negative counts

    def _old(self) -> bool:
        return self._clock() - self._oldest >= self._max_age_s

    async def _completes_a_batch(self, batch_ids: set[str]) -> bool:
        for batch_id in batch_ids:
            remaining = await self._processor.remaining(batch_id)
            if remaining is None:
                continue
            if self._pending_per_batch[batch_id] + self._unsettled_per_batch[batch_id] >= remaining:
                return True
        return False


def _log_retry(state: RetryCallState) -> None:
    error = state.outcome.exception() if state.outcome is not None else None
    wait = state.next_action.sleep if state.next_action is not None else None
    log.error(
        "processing a chunk failed; retrying",
        exc_info=error,
        extra={"attempt": state.attempt_number, "retry_in_s": None if wait is None else round(wait, 3)},
    )


def _observe_ages(stage: str, events: Sequence[ResultEvent]) -> float:
    """Record the age of the oldest and newest of ``events`` now; returns the oldest timestamp."""
    stamps = [event.message.timestamp for event in events]
    oldest, newest = min(stamps), max(stamps)
    now = time.time()
    metrics.RESULT_AGE.labels(stage, "oldest").observe(now - oldest)
    metrics.RESULT_AGE.labels(stage, "newest").observe(now - newest)
    return oldest
