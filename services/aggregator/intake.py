"""What the results agent does with each poll: coalesce, process in the background, ack once stored.

Short polls feed the coalescer, which decides where a chunk ends (``coalescer.py``); each chunk is
handled in the background (``pipeline.py``) while the next one is collected. A chunk's events are
acked only once its results are stored and counted: a chunk cut short by a crash, an error or
SIGTERM is never acked, so its offsets are never committed and it is delivered again. While a
dependency is down a chunk is retried (exponential backoff with jitter, tenacity), never dropped.

Free of faust: events are anything with ``value`` and ``message.key``/``message.timestamp``
(faust's ``EventT``), and acking is a callable (faust's ``Stream.ack``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, Generic, Protocol, TypeVar

from tenacity import AsyncRetrying, RetryCallState, wait_exponential_jitter

from services.aggregator import metrics
from services.aggregator.coalescer import ChunkCoalescer
from services.aggregator.pipeline import ChunkPipeline

log = logging.getLogger(__name__)

RETRY_FIRST_S = 0.2
RETRY_MAX_S = 5.0


class ResultEvent(Protocol):
    @property
    def value(self) -> Any: ...
    @property
    def message(self) -> Any: ...  # with ``key`` (bytes) and ``timestamp`` (Kafka's, seconds)


E = TypeVar("E", bound=ResultEvent)


def batch_of(event: ResultEvent) -> str | None:
    """Workers key a batch's results by its id (direct requests' results go to reply topics)."""
    key = event.message.key
    return key.decode(errors="replace") if isinstance(key, bytes) else None


def _log_retry(state: RetryCallState) -> None:
    error = state.outcome.exception() if state.outcome is not None else None
    wait = state.next_action.sleep if state.next_action is not None else None
    log.error(
        "processing a chunk failed; retrying",
        exc_info=error,
        extra={"attempt": state.attempt_number, "retry_in_s": None if wait is None else round(wait, 3)},
    )


class ResultsIntake(Generic[E]):
    def __init__(
        self,
        *,
        process: Callable[[Sequence[bytes | None]], Awaitable[None]],
        ack: Callable[[E], Awaitable[Any]],
        after_chunk: Callable[[], Awaitable[None]],
        remaining: Callable[[str], Awaitable[int | None]],
        progress: Callable[[], None],
        max_lines: int,
        max_age_s: float,
        retry_first_s: float = RETRY_FIRST_S,
        retry_max_s: float = RETRY_MAX_S,
    ) -> None:
        """``process`` stores and counts a chunk's values; ``after_chunk`` runs once it is acked
        (the counts flush); ``progress`` tells the stall watchdog the agent is alive."""
        self._process = process
        self._ack = ack
        self._after_chunk = after_chunk
        self._progress = progress
        self._retry_first_s = retry_first_s
        self._retry_max_s = retry_max_s
        self._pipeline: ChunkPipeline[E] = ChunkPipeline(self._handle)
        self._coalescer: ChunkCoalescer[E] = ChunkCoalescer(
            self._submit, max_lines=max_lines, max_age_s=max_age_s, batch_of=batch_of, remaining=remaining
        )

    async def add(self, events: list[E]) -> None:
        """One poll's events (possibly none)."""
        self._progress()
        if events:
            _observe_ages("polled", events)
        await self._coalescer.add(events)

    @contextlib.asynccontextmanager
    async def running(self, tick_s: float) -> AsyncIterator[None]:
        """Cut old chunks every ``tick_s`` (no poll comes when idle); abandon the chunk in flight on exit."""
        ticker = asyncio.create_task(self._tick_forever(tick_s))
        try:
            yield
        finally:
            ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ticker
            await self._pipeline.cancel()

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
                self._progress()  # a retry is progress: /readyz reports the dependency
                await self._process(values)

    async def _handle(self, events: list[E]) -> None:
        started = time.perf_counter()
        oldest = _observe_ages("chunk_started", events)
        await self.process_until_done([event.value for event in events])
        for event in events:
            await self._ack(event)
        self._coalescer.settled(events)
        await self._after_chunk()
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

    async def _submit(self, events: list[E]) -> None:
        waited = await self._pipeline.submit(events)
        if waited > 0.001:
            log.debug("chunk waited for the previous one", extra={"seconds": round(waited, 4)})

    async def _tick_forever(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self._coalescer.tick()
            except Exception:
                log.exception("cutting an old chunk failed; retrying at the next tick")


def _observe_ages(stage: str, events: Sequence[ResultEvent]) -> float:
    """Record the age of the oldest and newest of ``events`` now; returns the oldest timestamp."""
    stamps = [event.message.timestamp for event in events]
    oldest, newest = min(stamps), max(stamps)
    now = time.time()
    metrics.RESULT_AGE.labels(stage, "oldest").observe(now - oldest)
    metrics.RESULT_AGE.labels(stage, "newest").observe(now - newest)
    return oldest
