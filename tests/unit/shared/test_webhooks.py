"""Webhook signing (Standard Webhooks), event bodies, the retry schedule and the endpoint setting."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json

import pytest
from pydantic import ValidationError

from shared.documents import WebhookEventDocument
from shared.settings import WebhookSettings
from shared.webhook_signing import sign, signature_headers, verify
from shared.webhooks import event_body, event_id, retry_wait

# The test vector of the Standard Webhooks reference libraries (standard-webhooks/standard-webhooks).
SPEC_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
SPEC_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
SPEC_TIMESTAMP = 1614265330
SPEC_BODY = b'{"test": 2432232314}'
SPEC_SIGNATURE = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


def test_the_signature_matches_the_standard_webhooks_test_vector() -> None:
    assert sign(SPEC_SECRET, SPEC_ID, SPEC_TIMESTAMP, SPEC_BODY) == SPEC_SIGNATURE


def test_the_signature_is_an_hmac_of_id_timestamp_and_body_with_the_decoded_key() -> None:
    key = base64.b64decode(SPEC_SECRET.removeprefix("whsec_"))
    digest = hmac.new(key, b"evt_1.100.{}", hashlib.sha256).digest()
    assert sign(SPEC_SECRET, "evt_1", 100, b"{}") == "v1," + base64.b64encode(digest).decode()


def test_the_headers_carry_id_timestamp_and_a_verifiable_signature() -> None:
    headers = signature_headers(SPEC_SECRET, SPEC_ID, SPEC_TIMESTAMP, SPEC_BODY)
    assert headers["webhook-id"] == SPEC_ID
    assert headers["webhook-timestamp"] == str(SPEC_TIMESTAMP)
    assert verify(SPEC_SECRET, SPEC_ID, SPEC_TIMESTAMP, SPEC_BODY, headers["webhook-signature"])
    assert not verify(SPEC_SECRET, SPEC_ID, SPEC_TIMESTAMP, SPEC_BODY + b" ", headers["webhook-signature"])
    assert verify(SPEC_SECRET, SPEC_ID, SPEC_TIMESTAMP, SPEC_BODY, "v1,bm90IGl0 " + SPEC_SIGNATURE)


def test_the_event_body_is_openais_batch_event() -> None:
    event = WebhookEventDocument(
        _id=event_id("batch_abc", "batch.completed"),
        project="p",
        type="batch.completed",
        batch_id="batch_abc",
        created_at=1700000000,
    )
    assert json.loads(event_body(event)) == {
        "id": "evt_batch_abc_batch.completed",
        "object": "event",
        "type": "batch.completed",
        "created_at": 1700000000,
        "data": {"id": "batch_abc"},
    }


@pytest.mark.parametrize(
    ("attempts", "low", "high"),
    [(1, 2.5, 5.0), (2, 5.0, 10.0), (3, 10.0, 20.0), (10, 30.0, 60.0), (40, 30.0, 60.0)],
)
def test_the_retry_wait_doubles_with_jitter_up_to_the_cap(attempts: int, low: float, high: float) -> None:
    assert retry_wait(attempts, 5.0, 60.0, rand=lambda: 0.0) == low
    assert retry_wait(attempts, 5.0, 60.0, rand=lambda: 1.0) == high


def test_the_retry_schedule_with_a_fake_random_spans_the_window() -> None:
    waits = [retry_wait(n, 5.0, 3600.0, rand=lambda: 0.5) for n in range(1, 20)]
    assert waits == sorted(waits)
    assert waits[-1] == 0.75 * 3600.0


def endpoints_env(monkeypatch: pytest.MonkeyPatch, value: object) -> None:
    monkeypatch.setenv("BATCHSTREAM_WEBHOOK_ENDPOINTS", json.dumps(value))


def test_endpoints_are_read_per_project_from_json(monkeypatch: pytest.MonkeyPatch) -> None:
    endpoints_env(monkeypatch, {"team-a": {"url": "https://hooks.example/a", "secret": SPEC_SECRET}})
    endpoint = WebhookSettings().endpoints["team-a"]
    assert endpoint.url == "https://hooks.example/a"
    assert SPEC_SECRET not in repr(endpoint)  # the secret stays out of logs


def test_an_empty_endpoints_variable_means_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BATCHSTREAM_WEBHOOK_ENDPOINTS", "")  # docker-compose.yml's default
    assert WebhookSettings().endpoints == {}


@pytest.mark.parametrize(
    ("endpoint", "message"),
    [
        ({"url": "ftp://hooks.example/a", "secret": SPEC_SECRET}, "http(s)"),
        ({"url": "hooks.example/a", "secret": SPEC_SECRET}, "http(s)"),
        ({"url": "https://hooks.example/a", "secret": "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}, "whsec_"),
        ({"url": "https://hooks.example/a", "secret": "whsec_not base64!"}, "base64"),
        ({"url": "https://hooks.example/a", "secret": "whsec_c2hvcnQ="}, "24 bytes"),
    ],
)
def test_a_bad_endpoint_stops_the_start_with_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, endpoint: dict[str, str], message: str
) -> None:
    endpoints_env(monkeypatch, {"team-a": endpoint})
    with pytest.raises(ValidationError, match=message.replace("(", r"\(").replace(")", r"\)")):
        WebhookSettings()
