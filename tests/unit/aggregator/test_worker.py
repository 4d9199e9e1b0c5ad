"""The worker service: clients exist only between start and stop; the stall check ticks meanwhile."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest
from pymongo.errors import InvalidOperation

from services.aggregator.settings import AggregatorConfig
from services.aggregator.worker import AggregatorWorker, NotStarted
from tests.support.fakes import FakeResultsView


@dataclass
class FakeResultsViewSeen(FakeResultsView):
    """A fake results view that says when the stall check first read it."""

    read: asyncio.Event = field(default_factory=asyncio.Event)

    def phase(self) -> str:
        self.read.set()
        return super().phase()


async def test_clients_are_built_on_start_and_closed_on_stop() -> None:
    view = FakeResultsViewSeen(waiting={}, current_phase="rebalancing")
    worker = AggregatorWorker(AggregatorConfig(stall_check_seconds=0.01), {}, view)
    with pytest.raises(NotStarted):
        _ = worker.runtime  # importing and building the worker made no client
    await worker.start()
    try:
        runtime = worker.runtime
        await asyncio.wait_for(view.read.wait(), 10)  # the check runs from the start
        assert worker.stall_check.phase == "rebalancing"
    finally:
        await worker.stop()
    with pytest.raises(InvalidOperation):
        await runtime.mongo.ping()
