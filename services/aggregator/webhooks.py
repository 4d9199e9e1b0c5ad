"""The webhook deliverer: sends recorded batch events (``shared/webhooks.py``) to their endpoints.

It runs in the aggregator, beside finalize (which records most events) but never inside it: a
finalize only writes an event document, and this loop, started by the worker's own service
(``worker.py``), claims due events, POSTs each with the Standard Webhooks headers
(``shared/webhook_signing.py``) and records the outcome. Any aggregator may send any event (the
claim's lease keeps two from sending the same attempt); the api records ``batch.failed`` events
and this loop sends them too. Delivery is at least once: a crash after the POST and before the
outcome is written sends that attempt again after the lease, with the same ``webhook-id``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import aiohttp

from services.aggregator import metrics
from shared.documents import WebhookEventDocument
from shared.settings import WebhookSettings
from shared.stores.webhooks import WebhookEventStore
from shared.webhook_signing import signature_headers
from shared.webhooks import event_body, retry_wait

log = logging.getLogger(__name__)


class WebhookDeliverer:
    def __init__(
        self,
        events: WebhookEventStore,
        settings: WebhookSettings,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._events = events
        self._settings = settings
        self._clock = clock
        self._session: aiohttp.ClientSession | None = None

    async def deliver_due(self) -> int:
        """Send every event due now (``concurrency`` at a time); returns the attempts made."""
        sent = 0
        while True:
            claimed = await self._claim(self._settings.concurrency)
            if not claimed:
                break
            await asyncio.gather(*(self._attempt(event) for event in claimed))
            sent += len(claimed)
        metrics.WEBHOOK_QUEUE.set(await self._events.pending())
        return sent

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def _claim(self, limit: int) -> list[WebhookEventDocument]:
        claimed: list[WebhookEventDocument] = []
        while len(claimed) < limit:
            event = await self._events.claim(self._clock(), self._settings.lease_s)
            if event is None:
                break
            claimed.append(event)
        return claimed

    async def _attempt(self, event: WebhookEventDocument) -> None:
        endpoint = self._settings.endpoints.get(event.project)
        if endpoint is None:
            await self._events.give_up(event, "the project has no webhook endpoint any more")
            metrics.WEBHOOK_DELIVERIES.labels("failed").inc()
            return
        body = event_body(event)
        headers = signature_headers(endpoint.secret, event.id, int(self._clock()), body)
        metrics.WEBHOOK_ATTEMPTS.inc()
        error = await self._post(endpoint.url, body, headers)
        extra = {"event_id": event.id, "batch_id": event.batch_id, "attempt": event.attempts}
        if error is None:
            await self._events.delivered(event, self._clock())
            metrics.WEBHOOK_DELIVERIES.labels("delivered").inc()
            log.info("webhook delivered", extra=extra)
            return
        now = self._clock()
        if now - event.created_at >= self._settings.max_age_s:
            await self._events.give_up(event, error)
            metrics.WEBHOOK_DELIVERIES.labels("failed").inc()
            log.warning("webhook given up after its retry window", extra={**extra, "error": error})
            return
        wait = retry_wait(event.attempts, self._settings.first_retry_s, self._settings.max_retry_s)
        await self._events.retry_at(event, now + wait, error)
        metrics.WEBHOOK_DELIVERIES.labels("retry").inc()
        log.info("webhook attempt failed; retrying", extra={**extra, "error": error, "wait_s": wait})

    async def _post(self, url: str, body: bytes, headers: dict[str, str]) -> str | None:
        """None when the receiver answered 2xx, else what went wrong."""
        if self._session is None:
            self._session = aiohttp.ClientSession()
        timeout = aiohttp.ClientTimeout(total=self._settings.timeout_s)
        try:
            async with self._session.post(url, data=body, headers=headers, timeout=timeout) as answer:
                if 200 <= answer.status < 300:
                    return None
                return f"HTTP {answer.status}"
        except (aiohttp.ClientError, TimeoutError) as e:
            return f"{type(e).__name__}: {e}"
