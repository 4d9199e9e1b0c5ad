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
import ipaddress
import logging
import socket
import time
from collections.abc import Callable
from typing import Any

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from yarl import URL

from services.aggregator import metrics
from shared.documents import WebhookEventDocument
from shared.settings import WebhookSettings
from shared.stores.webhooks import WebhookEventStore
from shared.webhook_signing import signature_headers
from shared.webhooks import event_body, retry_wait

log = logging.getLogger(__name__)


class TargetRefused(OSError):
    """The endpoint is a loopback, link-local, private or otherwise non-public address."""


def refused_address(host: str) -> str | None:
    """Why a webhook may not go to the IP address ``host`` (None when it is public)."""
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None  # a name: checked once resolved
    if address.is_global:
        return None
    return f"{address} is not a public address (loopback, link-local, private or reserved)"


class PublicResolver(AbstractResolver):
    """Resolves like aiohttp's default resolver and keeps only public addresses, so a name that
    resolves to an internal host is refused on the connection actually made (no check-then-use gap)."""

    def __init__(self) -> None:
        self._inner = aiohttp.DefaultResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        found = await self._inner.resolve(host, port, family)
        public = [r for r in found if refused_address(r["host"]) is None]
        if not public:
            raise TargetRefused(f"{host} resolves only to addresses that are not public")
        return public

    async def close(self) -> None:
        await self._inner.close()


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
        if not self._settings.allow_private_targets:
            refusal = refused_address(URL(endpoint.url).host or "")
            if refusal is not None:
                await self._refuse(event, refusal)
                return
        body = event_body(event)
        headers = signature_headers(endpoint.secret, event.id, int(self._clock()), body)
        metrics.WEBHOOK_ATTEMPTS.inc()
        try:
            error = await self._post(endpoint.url, body, headers)
        except TargetRefused as refused:
            await self._refuse(event, str(refused))
            return
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

    async def _refuse(self, event: WebhookEventDocument, why: str) -> None:
        """Given up at once: retrying cannot make an internal target public."""
        error = f"webhook target refused: {why} (BATCHSTREAM_WEBHOOK_ALLOW_PRIVATE_TARGETS)"
        await self._events.give_up(event, error)
        metrics.WEBHOOK_DELIVERIES.labels("failed").inc()
        log.warning("webhook target refused", extra={"event_id": event.id, "error": error})

    async def _post(self, url: str, body: bytes, headers: dict[str, str]) -> str | None:
        """None when the receiver answered 2xx, else what went wrong. Redirects are never
        followed (a 3xx is a failed attempt): a receiver cannot send the signed POST elsewhere."""
        if self._session is None:
            options: dict[str, Any] = {}
            if not self._settings.allow_private_targets:
                options["connector"] = aiohttp.TCPConnector(resolver=PublicResolver())
            self._session = aiohttp.ClientSession(**options)
        timeout = aiohttp.ClientTimeout(total=self._settings.timeout_s)
        try:
            async with self._session.post(
                url, data=body, headers=headers, timeout=timeout, allow_redirects=False
            ) as answer:
                if 200 <= answer.status < 300:
                    return None
                if 300 <= answer.status < 400:
                    return f"HTTP {answer.status} (redirects are not followed)"
                return f"HTTP {answer.status}"
        except TargetRefused:
            raise
        except aiohttp.ClientConnectorError as e:
            if isinstance(e.os_error, TargetRefused):
                raise e.os_error from e
            return f"{type(e).__name__}: {e}"
        except (aiohttp.ClientError, TimeoutError) as e:
            return f"{type(e).__name__}: {e}"
