"""Batch webhooks end to end: a local receiver that verifies every Standard Webhooks signature.

A stack of its own (api, aggregator, the instant fake engine) on the shared stand-ins, whose
project ``default`` sends its batch events to a receiver in this process. The receiver records
every attempt it is sent and can answer 503 for a while (down), then 200.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from pymongo import MongoClient

from deploy.local import ModelSpec, Stack, free_port
from shared.settings import ApiSettings
from tests.integration.api.corpus import dump, line
from tests.support.http_batches import create_batch, wait_http_terminal
from tests.support.stacks import FAKE_STACK_ENV
from tests.support.waiting import wait_until

pytestmark = pytest.mark.e2e
MODEL = "corpus-fake"  # the corpus' request lines name it
UNSERVED = "webhooks-unserved"  # known to the api, served by no worker: a batch that waits
SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
CLOSED_KEY = "sk-webhooks-closed"  # project ``closed``, whose receiver is not listening at first


def verified(headers: dict[str, str], body: bytes) -> bool:
    """The receiver's check, written as docs/webhooks.md tells a user to (hmac, hashlib, base64)."""
    import base64
    import hashlib
    import hmac

    key = base64.b64decode(SECRET.removeprefix("whsec_"))
    signed = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + body
    expected = "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    return any(hmac.compare_digest(expected, s) for s in headers["webhook-signature"].split())


@dataclass
class Receiver:
    """Every attempt received (headers, event, signature valid), and the status it answers."""

    attempts: list[dict[str, Any]] = field(default_factory=list)
    answer: int = 200
    lock: threading.Lock = field(default_factory=threading.Lock)

    def for_event(self, event_id: str) -> list[dict[str, Any]]:
        with self.lock:
            return [a for a in self.attempts if a["headers"]["webhook-id"] == event_id]

    def for_batch(self, batch_id: str) -> list[dict[str, Any]]:
        with self.lock:
            return [a for a in self.attempts if a["event"]["data"]["id"] == batch_id]


@contextmanager
def serving(state: Receiver, port: int = 0) -> Iterator[int]:
    """An HTTP receiver on ``port`` (0: a free one) recording into ``state``; yields its port."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["content-length"]))
            headers = {k.lower(): v for k, v in self.headers.items()}
            with state.lock:
                state.attempts.append(
                    {"headers": headers, "event": json.loads(body), "valid": verified(headers, body)}
                )
                status = state.answer
            self.send_response(status)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.fixture(scope="module")
def receiver() -> Iterator[tuple[Receiver, int]]:
    state = Receiver()
    with serving(state) as port:
        yield state, port


@pytest.fixture(scope="module")
def closed_port() -> int:
    """The endpoint port of project ``closed``: nothing listens there until a test says so."""
    return free_port()


@pytest.fixture(scope="module")
def stack(own_stack: Any, receiver: tuple[Receiver, int], closed_port: int) -> Iterator[Stack]:
    _, port = receiver
    endpoints = {
        "default": {"url": f"http://127.0.0.1:{port}/hooks", "secret": SECRET},
        "closed": {"url": f"http://127.0.0.1:{closed_port}/hooks", "secret": SECRET},
    }
    env = {
        **FAKE_STACK_ENV,
        "BATCHSTREAM_API_KEYS": f"{ApiSettings().keys},{CLOSED_KEY}=closed",
        "BATCHSTREAM_AGGREGATOR_CANCEL_TIMEOUT_S": "2",
        "BATCHSTREAM_WEBHOOK_ENDPOINTS": json.dumps(endpoints),
        "BATCHSTREAM_WEBHOOK_ALLOW_PRIVATE_TARGETS": "true",  # the receivers listen on 127.0.0.1
        "BATCHSTREAM_WEBHOOK_POLL_SECONDS": "0.2",
        "BATCHSTREAM_WEBHOOK_FIRST_RETRY_S": "0.5",
        "BATCHSTREAM_WEBHOOK_MAX_RETRY_S": "1",
    }
    model = ModelSpec("", MODEL, engine="fake")
    with own_stack("webhooks", ["api", "aggregator", model.component], models=[model], extra_env=env) as s:
        yield s


@pytest.fixture(scope="module")
def api(stack: Stack) -> Iterator[httpx.Client]:
    headers = {"Authorization": f"Bearer {stack.api_key}"}
    with httpx.Client(base_url=stack.base_url.removesuffix("/v1"), headers=headers, timeout=60) as c:
        yield c


def unserved_model(stack: Stack) -> tuple[str, str]:
    """Make ``UNSERVED`` known to the api (no worker serves it); returns (mongo uri, database)."""
    env = stack.env()
    uri, database = env["BATCHSTREAM_MONGO_URI"], env["BATCHSTREAM_MONGO_DATABASE"]
    with MongoClient(uri) as client:
        client[database].models.update_one(
            {"_id": UNSERVED}, {"$set": {"created": 1, "max_context_length": 4096}}, upsert=True
        )
    return uri, database


def delivered_once(state: Receiver, batch_id: str, event_type: str) -> dict[str, Any]:
    """The one attempt that reached the receiver for the batch, after checking it."""
    attempts = wait_until(lambda: state.for_batch(batch_id), 30, f"the {event_type} event")
    assert len(attempts) == 1, attempts
    attempt = attempts[0]
    assert attempt["valid"], attempt
    event = attempt["event"]
    assert event["type"] == event_type and event["object"] == "event"
    assert event["id"] == attempt["headers"]["webhook-id"] == f"evt_{batch_id}_{event_type}"
    assert isinstance(event["created_at"], int)
    return attempt


def test_a_completed_batch_sends_one_signed_batch_completed_event(
    api: httpx.Client, receiver: tuple[Receiver, int]
) -> None:
    state, _ = receiver
    batch_id = create_batch(api, dump(*(line(f"c{n}") for n in range(3))))
    assert wait_http_terminal(api, batch_id, 60)["status"] == "completed"
    delivered_once(state, batch_id, "batch.completed")


def test_a_batch_failing_validation_sends_batch_failed(
    api: httpx.Client, receiver: tuple[Receiver, int]
) -> None:
    state, _ = receiver
    batch_id = create_batch(api, b"this is not json\n")
    assert wait_http_terminal(api, batch_id, 60)["status"] == "failed"
    delivered_once(state, batch_id, "batch.failed")


def test_a_cancelled_batch_sends_batch_cancelled(
    api: httpx.Client, stack: Stack, receiver: tuple[Receiver, int]
) -> None:
    state, _ = receiver
    unserved_model(stack)
    batch_id = create_batch(api, dump(line("a", body={**line()["body"], "model": UNSERVED})))
    wait_until(
        lambda: api.get(f"/v1/batches/{batch_id}").json()["status"] == "in_progress", 30, "in_progress"
    )
    assert api.post(f"/v1/batches/{batch_id}/cancel").status_code == 200
    assert wait_http_terminal(api, batch_id, 60)["status"] == "cancelled"
    delivered_once(state, batch_id, "batch.cancelled")


def test_an_expired_batch_sends_batch_expired(
    api: httpx.Client, stack: Stack, receiver: tuple[Receiver, int]
) -> None:
    state, _ = receiver
    db = unserved_model(stack)
    batch_id = create_batch(api, dump(line("a", body={**line()["body"], "model": UNSERVED})))
    wait_until(
        lambda: api.get(f"/v1/batches/{batch_id}").json()["status"] == "in_progress", 30, "in_progress"
    )
    with MongoClient(db[0]) as client:  # the completion window ends now (the sweep ends it)
        client[db[1]].batches.update_one({"_id": batch_id}, {"$set": {"expires_at": int(time.time()) - 1}})
    assert wait_http_terminal(api, batch_id, 60)["status"] == "expired"
    delivered_once(state, batch_id, "batch.expired")


def test_a_receiver_down_for_a_while_gets_the_event_after_retries_each_attempt_once(
    api: httpx.Client, stack: Stack, receiver: tuple[Receiver, int]
) -> None:
    state, _ = receiver
    with state.lock:
        state.answer = 503
    batch_id = create_batch(api, dump(line("a")))
    assert wait_http_terminal(api, batch_id, 60)["status"] == "completed"
    event_id = f"evt_{batch_id}_batch.completed"
    wait_until(lambda: len(state.for_event(event_id)) >= 3, 30, "three refused attempts")
    with state.lock:
        state.answer = 200
    env = stack.env()
    with MongoClient(env["BATCHSTREAM_MONGO_URI"]) as client:
        events = client[env["BATCHSTREAM_MONGO_DATABASE"]].webhook_events
        stored = wait_until(
            lambda: (e := events.find_one({"_id": event_id})) and e["status"] == "delivered" and e,
            30,
            "the event delivered",
        )
    attempts = state.for_event(event_id)
    assert len(attempts) == stored["attempts"] >= 4  # every attempt seen once, the last one answered
    assert all(a["valid"] for a in attempts)
    assert {a["headers"]["webhook-id"] for a in attempts} == {event_id}
    stamps = [int(a["headers"]["webhook-timestamp"]) for a in attempts]
    assert stamps == sorted(stamps)
    assert len({json.dumps(a["event"], sort_keys=True) for a in attempts}) == 1  # the same event


def settled_after_two(event: dict[str, Any] | None) -> dict[str, Any] | None:
    """The event once its second attempt has an outcome: ``attempts`` counts claims, so an event
    with two attempts may still be in its second one (lease held), which may yet be delivered."""
    if event is None or event["attempts"] < 2 or event["lease_until"]:
        return None
    return event


def test_a_receiver_not_listening_for_a_while_gets_the_event_once_it_listens(
    stack: Stack, closed_port: int
) -> None:
    headers = {"Authorization": f"Bearer {CLOSED_KEY}"}
    with httpx.Client(base_url=stack.base_url.removesuffix("/v1"), headers=headers, timeout=60) as closed:
        batch_id = create_batch(closed, dump(line("a")))
        assert wait_http_terminal(closed, batch_id, 60)["status"] == "completed"
    event_id = f"evt_{batch_id}_batch.completed"
    env = stack.env()
    with MongoClient(env["BATCHSTREAM_MONGO_URI"]) as client:
        events = client[env["BATCHSTREAM_MONGO_DATABASE"]].webhook_events
        refused = wait_until(
            lambda: settled_after_two(events.find_one({"_id": event_id})), 30, "refused attempts"
        )
        assert refused["status"] == "pending" and "Connect" in refused["last_error"], refused
        state = Receiver()
        with serving(state, closed_port):
            stored = wait_until(
                lambda: (e := events.find_one({"_id": event_id})) and e["status"] == "delivered" and e,
                30,
                "the event delivered once the receiver listens",
            )
    [attempt] = state.for_event(event_id)  # the attempts before it listened reached nobody
    assert attempt["valid"] and stored["attempts"] > refused["attempts"] >= 2
