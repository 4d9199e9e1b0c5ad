"""The webhook deliverer's decisions: delivered, retried with backoff, given up after its window.

A real aiohttp receiver on a free local port; the event store is an in-memory fake
(``FakeEventStore``, the same claim/settle rules as ``shared/stores/webhooks.py``) and the clock
a fake one, so a 72-hour window takes no time.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from services.aggregator import metrics
from services.aggregator.webhooks import WebhookDeliverer
from shared.documents import WebhookEventDocument
from shared.settings import WebhookEndpoint, WebhookSettings
from shared.webhook_signing import verify
from tests.support.fakes import FakeClock

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
DOCS = Path(__file__).resolve().parents[3] / "docs" / "webhooks.md"


class FakeEventStore:
    """In memory: claim takes a due, unleased pending event and counts the attempt."""

    def __init__(self, *events: WebhookEventDocument) -> None:
        self.events = {e.id: e for e in events}

    async def claim(self, now: float, lease_s: float) -> WebhookEventDocument | None:
        for e in self.events.values():
            if e.status == "pending" and e.next_attempt_at <= now and e.lease_until <= now:
                e.attempts += 1
                e.lease_until, e.lease_token = now + lease_s, f"t{e.attempts}"
                return e.model_copy()
        return None

    def _settle(self, event: WebhookEventDocument, **fields: Any) -> None:
        stored = self.events[event.id]
        if stored.lease_token == event.lease_token:
            for name, value in {**fields, "lease_until": 0.0}.items():
                setattr(stored, name, value)

    async def delivered(self, event: WebhookEventDocument, now: float) -> None:
        self._settle(event, status="delivered", delivered_at=now)

    async def retry_at(self, event: WebhookEventDocument, when: float, error: str) -> None:
        self._settle(event, next_attempt_at=when, last_error=error)

    async def give_up(self, event: WebhookEventDocument, error: str) -> None:
        self._settle(event, status="failed", last_error=error)

    async def pending(self) -> int:
        return sum(e.status == "pending" for e in self.events.values())


class Receiver:
    def __init__(self) -> None:
        self.answer = 200
        self.seen: list[tuple[dict[str, str], bytes]] = []

    async def handle(self, request: web.Request) -> web.Response:
        self.seen.append((dict(request.headers), await request.read()))
        return web.Response(status=self.answer)


@pytest.fixture
async def receiver() -> AsyncIterator[tuple[Receiver, str]]:
    state = Receiver()
    app = web.Application()
    app.router.add_post("/hooks", state.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield state, f"http://127.0.0.1:{port}/hooks"
    finally:
        await runner.cleanup()


def event(clock: FakeClock) -> WebhookEventDocument:
    return WebhookEventDocument(
        _id="evt_batch_1_batch.completed",
        project="p",
        type="batch.completed",
        batch_id="batch_1",
        created_at=int(clock()),
        next_attempt_at=clock(),
    )


def deliverer(store: FakeEventStore, url: str, clock: FakeClock, **overrides: Any) -> WebhookDeliverer:
    settings = WebhookSettings(
        endpoints={"p": WebhookEndpoint(url=url, secret=SECRET)},
        first_retry_s=10.0,
        max_retry_s=3600.0,
        max_age_s=72 * 3600.0,
        timeout_s=5.0,
        **{"allow_private_targets": True, **overrides},  # the receivers listen on 127.0.0.1
    )
    return WebhookDeliverer(store, settings, clock)  # type: ignore[arg-type]


def counter(outcome: str) -> float:
    return metrics.WEBHOOK_DELIVERIES.labels(outcome)._value.get()


async def test_a_2xx_delivers_the_event_with_a_valid_signature(receiver: tuple[Receiver, str]) -> None:
    state, url = receiver
    clock = FakeClock(1_700_000_000.0)
    store = FakeEventStore(event(clock))
    sender = deliverer(store, url, clock)
    before = counter("delivered")
    try:
        assert await sender.deliver_due() == 1
        assert await sender.deliver_due() == 0  # delivered: never sent again
    finally:
        await sender.close()
    assert store.events["evt_batch_1_batch.completed"].status == "delivered"
    assert counter("delivered") == before + 1
    [(headers, body)] = state.seen
    assert headers["webhook-id"] == "evt_batch_1_batch.completed"
    assert verify(
        SECRET, headers["webhook-id"], int(headers["webhook-timestamp"]), body, headers["webhook-signature"]
    )


async def test_refused_attempts_are_retried_with_growing_waits_then_given_up(
    receiver: tuple[Receiver, str],
) -> None:
    state, url = receiver
    state.answer = 503
    clock = FakeClock(1_700_000_000.0)
    store = FakeEventStore(event(clock))
    sender = deliverer(store, url, clock)
    stored = store.events["evt_batch_1_batch.completed"]
    waits: list[float] = []
    before = counter("failed")
    try:
        while stored.status == "pending":
            assert await sender.deliver_due() == 1
            assert await sender.deliver_due() == 0  # not due again before its wait
            if stored.status == "pending":
                waits.append(stored.next_attempt_at - clock())
                clock.now = stored.next_attempt_at
    finally:
        await sender.close()
    assert stored.status == "failed" and stored.last_error == "HTTP 503"
    assert counter("failed") == before + 1
    assert len(state.seen) == stored.attempts == len(waits) + 1  # each attempt reached the receiver once
    assert 5.0 <= waits[0] <= 10.0 and all(1800.0 <= w <= 3600.0 for w in waits[-3:])
    assert clock() - stored.created_at >= 72 * 3600  # retried for the whole window, not beyond one more wait
    assert clock() - stored.created_at < 72 * 3600 + 3600


async def test_a_receiver_that_is_not_listening_is_a_failed_attempt() -> None:
    clock = FakeClock(1_700_000_000.0)
    store = FakeEventStore(event(clock))
    sender = deliverer(store, "http://127.0.0.1:9/hooks", clock)  # discard port: nothing listens
    try:
        assert await sender.deliver_due() == 1
    finally:
        await sender.close()
    stored = store.events["evt_batch_1_batch.completed"]
    assert stored.status == "pending" and stored.next_attempt_at > clock()
    assert stored.last_error and "Connect" in stored.last_error


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://127.0.0.1:{port}/hooks", "127.0.0.1 is not a public address"),
        ("http://localhost:{port}/hooks", "localhost resolves only to addresses that are not public"),
        ("http://169.254.169.254/latest/meta-data", "169.254.169.254 is not a public address"),
        ("http://[::1]:{port}/hooks", "::1 is not a public address"),
        ("http://10.1.2.3/hooks", "10.1.2.3 is not a public address"),
    ],
)
async def test_an_internal_target_is_refused_unless_allowed(
    receiver: tuple[Receiver, str], url: str, why: str
) -> None:
    state, own = receiver
    port = int(own.rsplit(":", 1)[1].split("/")[0])
    clock = FakeClock(1_700_000_000.0)
    store = FakeEventStore(event(clock))
    sender = deliverer(store, url.format(port=port), clock, allow_private_targets=False)
    try:
        assert await sender.deliver_due() == 1
    finally:
        await sender.close()
    stored = store.events["evt_batch_1_batch.completed"]
    assert stored.status == "failed"  # given up at once: retrying cannot make it public
    assert stored.last_error and why in stored.last_error
    assert state.seen == []  # nothing reached the receiver


async def test_a_redirect_is_not_followed(receiver: tuple[Receiver, str]) -> None:
    state, target = receiver
    app = web.Application()

    async def redirect(request: web.Request) -> web.Response:
        raise web.HTTPTemporaryRedirect(target)  # 307: a client that follows replays the POST

    app.router.add_post("/moved", redirect)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    clock = FakeClock(1_700_000_000.0)
    store = FakeEventStore(event(clock))
    sender = deliverer(store, f"http://127.0.0.1:{runner.addresses[0][1]}/moved", clock)
    try:
        assert await sender.deliver_due() == 1
    finally:
        await sender.close()
        await runner.cleanup()
    stored = store.events["evt_batch_1_batch.completed"]
    assert stored.status == "pending" and stored.last_error == "HTTP 307 (redirects are not followed)"
    assert state.seen == []  # the signed POST never reached the redirect's target


def test_the_documented_verification_snippet_accepts_the_spec_vector_and_refuses_a_change() -> None:
    snippet = re.search(r"```python\n(.*?)```", DOCS.read_text(), re.DOTALL)
    assert snippet is not None
    namespace: dict[str, Any] = {}
    exec(snippet.group(1), namespace)  # the page's own code
    headers = {
        "webhook-id": "msg_p5jXN8AQM9LWM0D4loKWxJek",
        "webhook-timestamp": "1614265330",
        "webhook-signature": "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
    }
    body = b'{"test": 2432232314}'
    forever = 10**10
    assert namespace["verify"](SECRET, headers, body, tolerance_s=forever)
    assert not namespace["verify"](SECRET, headers, body + b" ", tolerance_s=forever)
    assert not namespace["verify"](SECRET, headers, body)  # a 2021 timestamp is a replay today
