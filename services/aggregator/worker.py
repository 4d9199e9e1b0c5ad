"""The worker's own service: its clients from start to stop, and the stall check in every phase.

faust starts this service with the app and before table recovery (``faust_adapter.start_with_app``)
and stops it after the app's consumer, agents and ``on_before_shutdown`` (which drains the runtime).
So the Mongo and S3 clients exist from before the agent's first chunk until after its last one,
and the stall supervisor (and the webhook deliverer, when a project has an endpoint) runs while
the worker rebalances or recovers, not only once it processes.
"""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from typing import Any

from mode import Service

from services.aggregator.runtime import Runtime
from services.aggregator.settings import AggregatorConfig
from services.aggregator.supervisor import ResultsView, StallSupervisor
from services.aggregator.watchdog import StallWatchdog

log = logging.getLogger(__name__)


class NotStarted(RuntimeError):
    """The worker's runtime was asked for before the worker started."""


class AggregatorWorker(Service):
    def __init__(
        self,
        config: AggregatorConfig,
        states: MutableMapping[str, Any],
        results: ResultsView,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.config = config
        self._states = states
        watchdog = StallWatchdog(config.stall_timeout_s, config.stall_unassigned_timeout_s)
        # Not ``supervisor``: mode.Service uses that name for its restart strategy.
        self.stall_check = StallSupervisor(watchdog, results, config.stall_exit_delay_s)
        self._runtime: Runtime | None = None

    @property
    def started(self) -> bool:
        return self._runtime is not None

    @property
    def runtime(self) -> Runtime:
        if self._runtime is None:
            raise NotStarted("the aggregator worker has not started")
        return self._runtime

    async def on_start(self) -> None:
        self._runtime = Runtime(self.config, self._states)
        self.add_future(self._supervise())
        if self._runtime.webhook_settings.endpoints:
            self.add_future(self._deliver_webhooks(self._runtime))

    async def _supervise(self) -> None:
        async for _ in self.itertimer(self.config.stall_check_seconds, name="stall-check"):
            try:
                self.stall_check.tick()
            except Exception:
                log.exception("stall check failed; trying again at the next one")

    async def _deliver_webhooks(self, runtime: Runtime) -> None:
        """Record missed batch ends, then send due webhook events (``webhooks.py``); from start
        to stop, rebalances included."""
        poll = runtime.webhook_settings.poll_seconds
        async for _ in self.itertimer(poll, name="webhooks"):
            try:
                await runtime.record_missed_ends()
                await runtime.webhooks.deliver_due()
            except Exception:
                log.exception("webhook delivery failed; trying again at the next poll")

    async def drain(self) -> None:
        """Finish running finalizations and write the last counts (the app is stopping)."""
        if self._runtime is not None:
            await self._runtime.drain()

    async def on_stop(self) -> None:
        if self._runtime is not None:
            await self._runtime.close()
