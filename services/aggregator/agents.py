"""The results agent, the counts, sweep and stall timers, and the /health and /metrics pages."""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import threading
import time
from typing import Any, cast

from faust import Stream
from faust.types import TP, EventT, StreamT
from faust.web import Request, Response, View
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from services.aggregator.app import app, config, kafka_settings
from services.aggregator.coalescer import ChunkCoalescer
from services.aggregator.metrics import REWINDS, STALLS
from services.aggregator.offset_gaps import GapRewinder, PartitionOffsets, unaccounted
from services.aggregator.pipeline import ChunkPipeline
from services.aggregator.runtime import Runtime, partition_for
from services.aggregator.tables import batch_states
from services.aggregator.topics import results
from services.aggregator.watchdog import StallWatchdog

log = logging.getLogger(__name__)

runtime = Runtime(config, batch_states)
RETRY_MAX_S = 5.0
STALL_EXIT_STATUS = 70  # EX_SOFTWARE
watchdog = StallWatchdog(config.stall_timeout_s, config.stall_unassigned_timeout_s)
rewinder: GapRewinder[TP] = GapRewinder(config.gap_rewind_after_s)


@app.agent(results, concurrency=1)
async def aggregate(stream: StreamT[bytes]) -> None:
    """Process results in chunks; ack a chunk's events only once it is stored and counted.

    ``noack_take`` leaves acking to us: a chunk cut short by a crash, an error or SIGTERM is
    never acked, so its offsets are never committed and it is delivered again. Short polls feed
    the coalescer, which decides where a chunk ends (``coalescer.py``); each chunk is handled in
    the background (``pipeline.py``) while the next one is collected.
    """

    async def handle(events: list[EventT[bytes]]) -> None:
        started = time.perf_counter()
        oldest = min(event.message.timestamp for event in events)
        await _process_until_done([event.value for event in events])
        for event in events:
            await stream.ack(event)
        coalescer.settled(events)
        await _flush_counts()
        log.debug(
            "chunk processed",
            extra={
                "events": len(events),
                "seconds": round(time.perf_counter() - started, 4),
                # Since the oldest event's Kafka timestamp: how far behind the results we are.
                "behind_s": round(time.time() - oldest, 3),
            },
        )

    async def submit(events: list[EventT[bytes]]) -> None:
        waited = await pipeline.submit(events)
        if waited > 0.001:
            log.debug("chunk waited for the previous one", extra={"seconds": round(waited, 4)})

    pipeline: ChunkPipeline[EventT[bytes]] = ChunkPipeline(handle)
    coalescer: ChunkCoalescer[EventT[bytes]] = ChunkCoalescer(
        submit,
        max_lines=config.chunk_lines,
        max_age_s=config.chunk_seconds,
        batch_of=_batch_of,
        remaining=runtime.processor.remaining,
    )
    ticker = asyncio.create_task(_tick_forever(coalescer, config.chunk_poll_seconds))
    # Short polls; the coalescer cuts the chunks. faust types noack_take's items as values; they
    # are the events.
    polls = cast(Stream[bytes], stream).noack_take(config.chunk_lines, within=config.chunk_poll_seconds)
    try:
        async for items in polls:
            watchdog.progress()
            await coalescer.add(cast(list[EventT[bytes]], items))
    finally:
        ticker.cancel()
        await pipeline.cancel()


def _batch_of(event: EventT[bytes]) -> str | None:
    """Workers key a batch's results by its id (direct requests' results go to reply topics)."""
    key = event.message.key
    return key.decode(errors="replace") if isinstance(key, bytes) else None


async def _tick_forever(coalescer: ChunkCoalescer[EventT[bytes]], interval_s: float) -> None:
    while True:
        await asyncio.sleep(interval_s)
        try:
            await coalescer.tick()
        except Exception:
            log.exception("cutting an old chunk failed; retrying at the next tick")


async def _process_until_done(values: list[Any]) -> None:
    """Retry a chunk while a dependency is down; lines already counted are dropped on retry."""
    delay = 0.2
    while True:
        watchdog.progress()
        try:
            await runtime.ensure_bucket()
            await runtime.processor.process(values)
            return
        except Exception:
            log.exception("processing a chunk failed; retrying", extra={"retry_in_s": delay})
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_MAX_S)


async def _flush_counts() -> None:
    """Counts reach MongoDB right after a chunk, not up to a timer period later."""
    try:
        await runtime.counts.flush()
    except Exception:
        log.exception("counts flush failed; retrying at the next flush")


@app.timer(config.counts_flush_seconds)
async def flush_counts() -> None:
    try:
        await runtime.counts.flush()
    except Exception:
        log.exception("counts flush failed; retrying at the next flush")


def owns(batch_id: str) -> bool:
    """True when this worker actively owns the batch's results partition."""
    partition = partition_for(batch_id, kafka_settings.results_partitions)
    return any(
        tp.topic == results.get_topic_name() and tp.partition == partition
        for tp in app.assignor.assigned_actives()
    )


@app.timer(config.sweep_seconds)
async def sweep() -> None:
    try:
        due = await runtime.processor.sweep(owns)
    except Exception:
        log.exception("sweep failed")
        return
    if due:
        log.info("sweep scheduled finalize", extra={"batch_ids": due})


def owned_results_partitions() -> list[TP]:
    """The results partitions this worker actively owns and its consumer has assigned."""
    topic = results.get_topic_name()
    try:
        assigned = app.consumer.assignment()
    except Exception:  # ConsumerNotStarted: no partitions yet
        return []
    return [tp for tp in app.assignor.assigned_actives() if tp.topic == topic and tp in assigned]


def backlog() -> dict[str, int | None]:
    """Results waiting per actively owned results partition: fetch high-water mark - committed.

    Both come from faust's consumer without a call into its consumer thread (which is what can
    hang): ``highwater`` reads aiokafka's last fetch answer (``None`` before the first one; Tansu's
    ListOffsets LATEST is wrong, the fetch's mark is right) and ``_committed_offset`` is the next
    offset faust committed or found committed on assignment (``None`` for 0).
    """
    return {
        f"{tp.topic}[{tp.partition}]": None
        if offsets.highwater is None
        else max(offsets.highwater - (offsets.committed or 0), 0)
        for tp, offsets in partition_offsets().items()
    }


def partition_offsets() -> dict[TP, PartitionOffsets]:
    """faust's bookkeeping of each owned results partition, read without a call into its thread."""
    consumer = cast(Any, app.consumer)
    in_flight: dict[TP, list[int]] = collections.defaultdict(list)
    for message in list(consumer._unacked_messages):  # a weak set; acked ones linger in it
        if not message.acked:
            in_flight[message.tp].append(message.offset)
    view: dict[TP, PartitionOffsets] = {}
    for tp in owned_results_partitions():
        try:
            highwater = consumer.highwater(tp)
        except AssertionError:  # aiokafka: revoked since ``assignment()``
            continue
        view[tp] = PartitionOffsets(
            committed=consumer._committed_offset.get(tp),
            acked=tuple(consumer._acked.get(tp) or ()),
            gap_starts=tuple(gap.begin for gap in consumer._gap.get(tp) or ()),
            highwater=highwater,
            in_flight=tuple(in_flight.get(tp, ())),
        )
    return view


def describe_offsets(view: dict[TP, PartitionOffsets]) -> dict[str, dict[str, Any]]:
    """A short account of ``partition_offsets()`` for the log."""
    return {
        f"{tp.topic}[{tp.partition}]": {
            "committed": offsets.committed,
            "highwater": offsets.highwater,
            "acked_not_committed": len(offsets.acked),
            "lowest_acked": min(offsets.acked, default=None),
            "in_flight": len(offsets.in_flight),
            "unaccounted": unaccounted(offsets),
        }
        for tp, offsets in view.items()
    }


@app.timer(config.gap_check_seconds)
async def rewind_lost_offsets() -> None:
    """Fetch again the results faust dropped and will never deliver (offset_gaps.py)."""
    view = partition_offsets()
    for tp in rewinder.due({tp: unaccounted(offsets) for tp, offsets in view.items()}):
        committed = view[tp].committed
        assert committed is not None  # ``unaccounted`` reports nothing without it
        REWINDS.inc()
        log.warning(
            "results offsets that faust will not deliver; fetching again from the committed one",
            extra={"partition": f"{tp.topic}[{tp.partition}]", "offsets": describe_offsets({tp: view[tp]})},
        )
        try:
            await app.consumer.seek_wait({tp: committed})
        except Exception:
            log.exception("rewinding failed; retrying after the next wait", extra={"partition": str(tp)})


@app.timer(config.stall_check_seconds)
async def check_stall() -> None:
    if watchdog.stalled:
        return
    reason = watchdog.check(backlog())
    if reason is None:
        return
    STALLS.inc()
    log.error(
        "aggregator stalled; exiting so that it is restarted",
        extra={
            "reason": reason,
            "exit_in_s": config.stall_exit_delay_s,
            "status": STALL_EXIT_STATUS,
            "offsets": describe_offsets(partition_offsets()),
        },
    )
    # A thread, not the loop: a graceful stop could wait on the stuck consumer forever. Nothing
    # is lost: unacked results are delivered again and the bitmap drops lines already counted.
    exit_timer = threading.Timer(config.stall_exit_delay_s, _exit_stalled)
    exit_timer.daemon = True
    exit_timer.start()


def _exit_stalled() -> None:
    for handler in logging.getLogger().handlers:
        handler.flush()
    os._exit(STALL_EXIT_STATUS)


@app.page("/health")
async def health(self: View, request: Request) -> Response:
    if watchdog.reason is not None:
        return self.json({"status": "stalled", "reason": watchdog.reason}, status=503)
    if await runtime.healthy():
        return self.json({"status": "healthy", "backlog": backlog()})
    return self.json({"status": "unhealthy"}, status=503)


@app.page("/metrics")
async def prometheus_metrics(self: View, request: Request) -> Response:
    # aiohttp refuses a charset in ``content_type``, so the full type goes in as a header.
    return self.bytes(generate_latest(), headers={"Content-Type": CONTENT_TYPE_LATEST})


@app.on_before_shutdown.connect  # type: ignore[arg-type]  # mode's stub wants a sync-or-awaitable union
async def on_shutdown(sender: Any, *args: Any, signal: Any, **kwargs: Any) -> None:
    await runtime.shutdown()
