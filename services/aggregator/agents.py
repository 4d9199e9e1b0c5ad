"""Wiring only: the results agent, the timers, the pages and the worker's own service.

What each piece does lives in its module. A result goes from the agent here to ``intake.py``
(chunks cut, acked once stored), ``counting.py`` (stored, counted, live counts flushed) and
``finalize.py`` (the batch's files written, the batch ended). The timers are in ``timers.py`` and
``counting.py``, the pages in ``pages.py``, the clients and the stall check in ``worker.py``, and
everything read from faust's internals in ``faust_adapter.py``. Importing this module builds no
client: they are built when the worker starts.
"""

from __future__ import annotations

from typing import Any

from faust.types import TP, EventT, StreamT
from faust.web import Request, Response, View

from services.aggregator import pages, timers
from services.aggregator.app import app, config, kafka_settings
from services.aggregator.faust_adapter import ResultsPartitions, noack_chunks, start_with_app
from services.aggregator.intake import ResultsIntake
from services.aggregator.offset_gaps import GapRewinder
from services.aggregator.tables import batch_states
from services.aggregator.topics import results
from services.aggregator.worker import AggregatorWorker

results_partitions = ResultsPartitions(app, results.get_topic_name())
worker = AggregatorWorker(config, batch_states, results_partitions)
start_with_app(app, worker)
rewinder: GapRewinder[TP] = GapRewinder(config.gap_rewind_after_s)


@app.agent(results, concurrency=1)
async def aggregate(stream: StreamT[bytes]) -> None:
    """Process results in chunks; ack a chunk's events only once it is stored and counted."""
    intake: ResultsIntake[EventT[bytes]] = ResultsIntake(
        config, stream=stream, processor=worker.runtime.processor, stall_check=worker.stall_check
    )
    async with intake.running():
        async for events in noack_chunks(stream, config.chunk_lines, config.chunk_poll_seconds):
            await intake.add(events)


@app.timer(config.counts_flush_seconds)
async def flush_counts() -> None:
    await worker.runtime.processor.flush_counts()


@app.timer(config.sweep_seconds)
async def sweep() -> None:
    await timers.sweep(worker.runtime, results_partitions, kafka_settings.results_partitions)


@app.timer(config.gap_check_seconds)
async def rewind_lost_offsets() -> None:
    await timers.rewind_lost_offsets(results_partitions, rewinder)


async def _readiness(view: View) -> Response:
    answer = await pages.readyz(
        stalled=worker.stall_check.reason,
        phase=worker.stall_check.phase,
        dependencies=worker.runtime if worker.started else None,
        backlog=results_partitions.backlog(),
    )
    return view.json(answer.body, status=answer.status)


@app.page("/livez")
async def livez(self: View, request: Request) -> Response:
    answer = pages.livez(worker.stall_check.phase)
    return self.json(answer.body, status=answer.status)


@app.page("/readyz")
async def readyz(self: View, request: Request) -> Response:
    return await _readiness(self)


@app.page("/health")
async def health(self: View, request: Request) -> Response:
    return await _readiness(self)


@app.page("/metrics")
async def prometheus_metrics(self: View, request: Request) -> Response:
    body, content_type = pages.metrics()
    return self.bytes(body, headers={"Content-Type": content_type})


@app.on_before_shutdown.connect  # type: ignore[arg-type]  # mode's stub wants a sync-or-awaitable union
async def on_shutdown(sender: Any, *args: Any, signal: Any, **kwargs: Any) -> None:
    await worker.drain()
