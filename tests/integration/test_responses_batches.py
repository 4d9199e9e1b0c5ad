"""Responses batches, cached prompt tokens and message batches, end to end through the unmodified
``openai`` and ``anthropic`` SDKs.

Runs on the whole stack (stand-in servers, api, aggregator, one vLLM worker on the tiny model):
``/v1/responses`` lines go through vLLM's own Responses serving code, and the batch's ``usage``
sums the lines' usage, cached prompt tokens included.
"""

from __future__ import annotations

from typing import Any

import anthropic
import pytest
from openai import OpenAI

from deploy.local.stack import Stack
from tests.support.lines import chat_line, read_lines, request_line
from tests.support.waiting import wait_terminal, wait_until

pytestmark = pytest.mark.e2e

RESPONSES = "/v1/responses"
# Long enough to fill several KV cache blocks, so a repeat of it is served from the prefix cache.
LONG_PROMPT = " ".join(f"fact {i}: the sky was blue on day {i}." for i in range(60))


@pytest.fixture(scope="module")
def client(stack: Stack) -> OpenAI:
    return OpenAI(base_url=stack.base_url, api_key=stack.api_key, max_retries=5)


def run_batch(client: OpenAI, endpoint: str, lines: list[str], **extra: Any) -> Any:
    upload = client.files.create(file=("input.jsonl", "\n".join(lines).encode()), purpose="batch")
    created = client.batches.create(
        input_file_id=upload.id,
        endpoint=endpoint,  # type: ignore[arg-type]
        completion_window="24h",
        extra_body=extra or None,
    )
    return wait_terminal(client, created.id, timeout_s=300)


def summed(lines: list[dict[str, Any]], *path: str) -> int:
    total = 0
    for line in lines:
        value: Any = line["response"]["body"]["usage"]
        for key in path:
            value = value[key]
        total += value
    return total


def test_a_responses_batch_completes_with_response_objects_and_summed_usage(
    client: OpenAI, model_id: str
) -> None:
    bodies = {
        "text": {"input": "Say hello", "instructions": "Answer briefly.", "max_output_tokens": 6},
        "items": {"input": [{"role": "user", "content": "Count to three"}], "temperature": 0.0},
        "stored": {"input": "Name a colour", "store": True},
    }
    lines = [request_line(cid, RESPONSES, {"model": model_id, **body}) for cid, body in bodies.items()]
    batch = run_batch(client, RESPONSES, lines, max_decoding_length=4)

    assert batch.status == "completed", batch
    assert batch.endpoint == RESPONSES and batch.model == model_id
    assert batch.request_counts is not None and batch.request_counts.completed == 3
    assert batch.error_file_id is None
    output = read_lines(client, batch.output_file_id)
    assert [line["custom_id"] for line in output] == list(bodies)
    for line in output:
        assert line["id"].startswith("batch_req_") and line["error"] is None
        assert line["response"]["status_code"] == 200
        body = line["response"]["body"]
        assert body["object"] == "response" and body["id"].startswith("resp_")
        assert body["model"] == model_id and body["status"] in ("completed", "incomplete")
        assert body["output"][0]["type"] == "message"
        assert body["usage"]["input_tokens"] > 0 and body["usage"]["output_tokens"] > 0
    by_id = {line["custom_id"]: line["response"]["body"] for line in output}
    assert by_id["text"]["max_output_tokens"] == 6  # the line's own cap wins
    assert by_id["items"]["max_output_tokens"] == 4  # the batch's max_decoding_length
    assert by_id["items"]["usage"]["output_tokens"] <= 4

    assert batch.usage is not None
    assert batch.usage.input_tokens == summed(output, "input_tokens")
    assert batch.usage.output_tokens == summed(output, "output_tokens")
    assert batch.usage.total_tokens == summed(output, "total_tokens")
    assert batch.usage.input_tokens_details.cached_tokens == summed(
        output, "input_tokens_details", "cached_tokens"
    )


def test_a_responses_line_that_needs_a_stored_response_fails_validation(
    client: OpenAI, model_id: str
) -> None:
    lines = [
        request_line("ok", RESPONSES, {"model": model_id, "input": "hi"}),
        request_line("bg", RESPONSES, {"model": model_id, "input": "hi", "background": True}),
        request_line("stream", RESPONSES, {"model": model_id, "input": "hi", "stream": True}),
    ]
    batch = run_batch(client, RESPONSES, lines)

    assert batch.status == "failed"
    assert batch.errors is not None and batch.errors.data is not None
    found = {(e.line, e.code, e.param) for e in batch.errors.data}
    assert found == {(2, "invalid_request", "body.background"), (3, "streaming_unsupported", "body.stream")}


def test_a_repeated_long_prompt_is_counted_as_cached_input_tokens(client: OpenAI, model_id: str) -> None:
    lines = [chat_line(f"same-{i}", model_id, LONG_PROMPT, max_tokens=2) for i in range(4)]
    batch = run_batch(client, "/v1/chat/completions", lines)

    assert batch.status == "completed", batch
    output = read_lines(client, batch.output_file_id)
    cached = [line["response"]["body"]["usage"]["prompt_tokens_details"]["cached_tokens"] for line in output]
    assert batch.usage is not None
    assert batch.usage.input_tokens_details.cached_tokens == sum(cached) > 0, cached
    prompt = output[0]["response"]["body"]["usage"]["prompt_tokens"]
    assert max(cached) < prompt  # vLLM recomputes at least the prompt's last token


def test_a_message_batch_runs_through_vllms_messages_serving(stack: Stack, model_id: str) -> None:
    """The unmodified ``anthropic`` SDK: a message batch's requests run through vLLM's own
    Anthropic Messages serving code; an errored request keeps Anthropic's error shape."""
    claude = anthropic.Anthropic(
        base_url=stack.base_url.removesuffix("/v1"), api_key=stack.api_key, max_retries=5
    )
    user = [{"role": "user", "content": "Say hello"}]
    requests: list[Any] = [
        {"custom_id": "plain", "params": {"model": model_id, "max_tokens": 6, "messages": user}},
        {
            "custom_id": "system",
            "params": {"model": model_id, "max_tokens": 4, "system": "Be brief.", "messages": user},
        },
        {  # a role vLLM's Messages request refuses: this request's own error, the others run
            "custom_id": "bad-role",
            "params": {"model": model_id, "max_tokens": 4, "messages": [{"role": "robot", "content": "hi"}]},
        },
    ]
    created = claude.messages.batches.create(requests=requests)

    def ended() -> Any:
        batch = claude.messages.batches.retrieve(created.id)
        return batch if batch.processing_status == "ended" else None

    done = wait_until(ended, 300, "the message batch ended", interval_s=0.5)
    assert (done.request_counts.succeeded, done.request_counts.errored) == (2, 1)
    results = {r.custom_id: r.result for r in claude.messages.batches.results(done.id)}
    for custom_id in ("plain", "system"):
        result = results[custom_id]
        assert result.type == "succeeded"
        message = result.message
        assert message.model == model_id and message.content[0].type == "text"
        assert message.stop_reason in ("end_turn", "max_tokens")
        assert 0 < message.usage.output_tokens <= 6 and message.usage.input_tokens > 0
    bad = results["bad-role"]
    assert bad.type == "errored" and bad.error.type == "error"
    assert bad.error.error.type == "invalid_request_error"
