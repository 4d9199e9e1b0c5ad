"""Message batches: the checks of a create's requests, and the batch and its result lines in
Anthropic's shapes."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from services.api.service.message_batches import MessageBatchService, check_requests, parse_create
from shared.documents import BatchDocument
from shared.errors import InvalidRequest, QuotaExceeded
from shared.protocol.anthropic import MessageBatchCreateParams, message_batch, result_line, rfc3339
from shared.protocol.messages import TokenUsage
from shared.protocol.openai import RequestCounts
from shared.settings import ApiSettings
from tests.support.lines import served

MODELS = served(small=100, big=4096)
URL = "http://api/v1/messages/batches/batch_1/results"


def request(custom_id: Any, **params: Any) -> dict[str, Any]:
    body = {"model": "small", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]}
    return {"custom_id": custom_id, "params": {**body, **params}}


def refusal(requests: list[dict[str, Any]], **settings: Any) -> str:
    params = MessageBatchCreateParams.model_validate({"requests": requests})
    with pytest.raises(InvalidRequest) as refused:
        check_requests(params, MODELS, ApiSettings(**settings))
    assert refused.value.param == "requests"
    return refused.value.message


def test_good_requests_on_several_models_pass() -> None:
    params = MessageBatchCreateParams.model_validate(
        {"requests": [request("a"), request("b", model="big", max_tokens=4000, system="Be brief.")]}
    )
    check_requests(params, MODELS, ApiSettings())


def test_every_bad_request_is_named_by_its_index_and_custom_id() -> None:
    message = refusal(
        [
            request("ok"),
            request("nobody", model="nobody-serves-it"),
            request("long", max_tokens=101),
            request("streamed", stream=True),
            {"custom_id": "empty", "params": {"model": "small", "max_tokens": 8, "messages": []}},
            {
                "custom_id": "no-cap",
                "params": {"model": "small", "messages": [{"role": "user", "content": "x"}]},
            },
            {"custom_id": "not-an-object", "params": ["x"]},
            request("has space"),
            request("x" * 65),
            request(7),
            request("ok"),
        ]
    )
    assert message.startswith("10 invalid requests: requests[1] (custom_id 'nobody'): ")
    assert "the model 'nobody-serves-it' does not exist" in message
    assert (
        "requests[2] (custom_id 'long'): params.max_tokens: 101 exceeds the model's context length of 100"
        in message
    )
    assert "requests[3] (custom_id 'streamed'): params.stream: streaming is not supported" in message
    assert "requests[4] (custom_id 'empty'): params.messages: List should have at least 1 item" in message
    assert "requests[5] (custom_id 'no-cap'): params.max_tokens: Field required" in message
    assert "requests[6] (custom_id 'not-an-object'): params must be an object" in message
    for index in (7, 8, 9):
        assert f"requests[{index}] " in message
    assert "requests[10] (custom_id 'ok'): custom_id is not unique in the batch" in message
    assert "requests[0]" not in message


def test_the_named_requests_are_bounded() -> None:
    message = refusal([request(f"bad-{n}", model="nope") for n in range(30)], max_reported_errors=3)
    assert message.startswith("30 invalid requests") and message.endswith("… and 27 more.")
    assert "requests[2] " in message and "requests[3] " not in message


def test_empty_too_many_and_oversized_requests_are_refused() -> None:
    assert "at least one request" in refusal([])
    assert "3 requests; the limit is 2" in refusal([request(n) for n in "abc"], max_batch_lines=2)
    big = refusal([request("big", messages=[{"role": "user", "content": "x" * 500}])], max_line_bytes=300)
    assert "(custom_id 'big'): the request is" in big and "the limit is 300 bytes per request" in big


def batch(**fields: Any) -> BatchDocument:
    base: dict[str, Any] = {
        "_id": "batch_1",
        "endpoint": "/v1/messages",
        "input_file_id": "file_1",
        "status": "in_progress",
        "created_at": 1_760_000_000,
        "expires_at": 1_760_086_400,
        "request_counts": RequestCounts(total=10, completed=4, failed=1),
    }
    return BatchDocument.model_validate({**base, **fields})


def test_a_running_batch_counts_live_and_has_no_results_yet() -> None:
    shown = message_batch(batch(), None, URL)
    assert shown.processing_status == "in_progress" and shown.results_url is None and shown.ended_at is None
    assert shown.request_counts.model_dump() == {
        "processing": 5,
        "succeeded": 4,
        "errored": 1,
        "canceled": 0,
        "expired": 0,
    }
    assert (shown.created_at, shown.expires_at) == ("2025-10-09T08:53:20Z", "2025-10-10T08:53:20Z")
    canceling = message_batch(batch(status="cancelling", cancelling_at=1_760_000_060), None, URL)
    assert canceling.processing_status == "canceling"
    assert canceling.cancel_initiated_at == rfc3339(1_760_000_060)


def test_an_ended_batch_splits_its_failed_lines_into_errored_canceled_and_expired() -> None:
    ended = batch(
        status="cancelled",
        cancelled_at=1_760_000_100,
        request_counts=RequestCounts(total=10, completed=4, failed=6),
    )
    shown = message_batch(ended, {"batch_cancelled": 4, "batch_expired": 1}, URL)
    assert shown.processing_status == "ended" and shown.results_url == URL
    assert shown.ended_at == "2025-10-09T08:55:00Z"
    counts = shown.request_counts
    assert (counts.processing, counts.succeeded, counts.errored, counts.canceled, counts.expired) == (
        0,
        4,
        1,
        4,
        1,
    )


def line(**fields: Any) -> bytes:
    return orjson.dumps({"id": "batch_req_1", "custom_id": "q1", "response": None, "error": None, **fields})


def test_output_and_error_lines_become_anthropic_results() -> None:
    message = {"id": "chatcmpl-1", "type": "message", "content": [{"type": "text", "text": "ok"}]}
    succeeded = result_line(line(response={"status_code": 200, "request_id": "r", "body": message}))
    assert orjson.loads(succeeded or b"") == {
        "custom_id": "q1",
        "result": {"type": "succeeded", "message": message},
    }
    assert (succeeded or b"").endswith(b"\n")

    anthropic_error = {"type": "error", "error": {"type": "invalid_request_error", "message": "bad"}}
    errored = result_line(line(response={"status_code": 400, "request_id": "r", "body": anthropic_error}))
    assert orjson.loads(errored or b"")["result"] == {"type": "errored", "error": anthropic_error}
    openai_error = {"error": {"message": "overloaded", "type": "server_error", "param": None, "code": 503}}
    reshaped = result_line(line(response={"status_code": 503, "request_id": "r", "body": openai_error}))
    assert orjson.loads(reshaped or b"")["result"]["error"] == {
        "type": "error",
        "error": {"type": "api_error", "message": "overloaded"},
    }
    for code, kind in (("batch_cancelled", "canceled"), ("batch_expired", "expired")):
        not_run = result_line(line(error={"code": code, "message": "not run"}))
        assert orjson.loads(not_run or b"")["result"] == {"type": kind}
    unknown = result_line(line(error={"code": "model_not_found", "message": "no such model"}))
    assert orjson.loads(unknown or b"")["result"]["error"]["error"] == {
        "type": "not_found_error",
        "message": "no such model",
    }
    assert result_line(b"  ") is None


def test_a_messages_usage_counts_cached_prompt_tokens_in_the_prompt() -> None:
    usage = {
        "input_tokens": 5,
        "cache_read_input_tokens": 30,
        "cache_creation_input_tokens": 2,
        "output_tokens": 4,
    }
    counted = TokenUsage.from_body_usage(usage)
    assert counted is not None
    assert (counted.prompt_tokens, counted.cached_tokens, counted.completion_tokens) == (37, 30, 4)
    assert counted.total_tokens == 41
    plain = TokenUsage.from_body_usage({"input_tokens": 5, "output_tokens": 4})
    assert plain is not None and (plain.prompt_tokens, plain.cached_tokens, plain.total_tokens) == (5, 0, 9)


@pytest.mark.parametrize(
    ("body", "said", "param"),
    [
        (b"{not json", "The request body is not valid JSON.", None),
        (b"[]", "body: Input should be a valid dictionary", "body"),
        (b"{}", "requests: Field required.", "requests"),
        (b'{"requests": {}}', "requests: Input should be a valid list.", "requests"),
        (b'{"requests": [], "model": "x"}', "model: Extra inputs are not permitted.", "model"),
        (
            b'{"requests": [{"custom_id": "a", "parms": {}}]}',
            "requests.0.parms: Extra inputs",
            "requests.0.parms",
        ),
    ],
)
def test_a_create_body_that_is_not_one_is_refused_naming_the_field(
    body: bytes, said: str, param: str | None
) -> None:
    with pytest.raises(InvalidRequest) as refused:
        parse_create(body)
    assert refused.value.message.startswith(said) and refused.value.param == param


async def test_a_create_past_the_bound_on_creates_at_once_is_429_until_one_ends() -> None:
    settings = ApiSettings(max_message_batch_creates=1)
    service = MessageBatchService(None, None, None, None, None, settings)  # type: ignore[arg-type]
    async with service.admitted():
        with pytest.raises(QuotaExceeded) as refused:
            async with service.admitted():
                pass
    assert refused.value.status_code == 429 and refused.value.code == "too_many_creates"
    assert refused.value.retry_after_s == 1
    async with service.admitted():  # the first ended: room again
        pass


def test_a_clients_long_key_is_cut_in_the_refusal() -> None:
    with pytest.raises(InvalidRequest) as refused:
        parse_create(orjson.dumps({"requests": [], "x" * 10_000: 1}))
    assert len(refused.value.message) < 400 and "10000 characters" in refused.value.message
