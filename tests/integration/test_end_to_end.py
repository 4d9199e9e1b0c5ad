"""A batch from upload to downloaded output through the unmodified ``openai`` SDK.

Runs on the whole stack: stand-in servers, api, aggregator and one vLLM worker on the tiny model.
"""

from __future__ import annotations

import pytest
from openai import OpenAI

from deploy.local.stack import Stack
from tests.support.lines import chat_line, read_lines
from tests.support.waiting import wait_terminal

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def client(stack: Stack) -> OpenAI:
    return OpenAI(base_url=stack.base_url, api_key=stack.api_key, max_retries=5)


def test_a_chat_batch_completes_with_every_line_generated_once(client: OpenAI, model_id: str) -> None:
    ids = [f"req-{i}" for i in range(24)]
    data = "\n".join(chat_line(i, model_id, f"Say {i}", max_tokens=8) for i in ids).encode()
    upload = client.files.create(file=("chat.jsonl", data), purpose="batch")
    assert upload.bytes == len(data)

    created = client.batches.create(
        input_file_id=upload.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"suite": "e2e"},
        output_expires_after={"anchor": "created_at", "seconds": 3600},
    )
    assert created.status == "validating"
    batch = wait_terminal(client, created.id, timeout_s=300)

    assert batch.status == "completed", batch
    assert batch.model == model_id
    assert batch.metadata == {"suite": "e2e"}
    assert batch.request_counts is not None
    assert (batch.request_counts.total, batch.request_counts.completed, batch.request_counts.failed) == (
        len(ids),
        len(ids),
        0,
    )
    assert batch.error_file_id is None and batch.output_file_id
    assert batch.in_progress_at and batch.finalizing_at and batch.completed_at
    assert batch.created_at <= batch.in_progress_at <= batch.finalizing_at <= batch.completed_at

    output = client.files.retrieve(batch.output_file_id)
    assert output.purpose == "batch_output"
    assert output.expires_at == batch.created_at + 3600, "output_expires_after applies to the output"
    lines = read_lines(client, batch.output_file_id)
    assert sorted(line["custom_id"] for line in lines) == sorted(ids)
    assert [line["custom_id"] for line in lines] == ids, "output keeps the input order"
    output_tokens = 0
    for line in lines:
        assert line["id"].startswith("batch_req_") and line["error"] is None
        assert line["response"]["status_code"] == 200
        body = line["response"]["body"]
        assert body["object"] == "chat.completion" and body["model"] == model_id
        assert isinstance(body["choices"][0]["message"]["content"], str)
        assert body["usage"]["completion_tokens"] > 0
        output_tokens += body["usage"]["completion_tokens"]
    assert batch.usage is not None and batch.usage.output_tokens == output_tokens


def test_a_line_the_engine_rejects_lands_in_the_error_file(client: OpenAI, model_id: str) -> None:
    lines = [
        chat_line("fine", model_id, "hello", max_tokens=4),
        chat_line("too-long", model_id, "hello " * 5000, max_tokens=4),  # over max_model_len
    ]
    upload = client.files.create(file=("mixed.jsonl", "\n".join(lines).encode()), purpose="batch")
    created = client.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    batch = wait_terminal(client, created.id, timeout_s=300)

    assert batch.status == "completed"
    assert batch.request_counts is not None
    assert (batch.request_counts.completed, batch.request_counts.failed) == (1, 1)
    assert batch.output_file_id and batch.error_file_id
    (ok,) = read_lines(client, batch.output_file_id)
    (bad,) = read_lines(client, batch.error_file_id)
    assert ok["custom_id"] == "fine"
    assert bad["custom_id"] == "too-long" and bad["error"] is None
    assert bad["response"]["status_code"] == 400
    assert bad["response"]["body"]["error"]["message"]


def test_an_invalid_input_file_fails_the_batch_listing_every_bad_line(client: OpenAI, model_id: str) -> None:
    lines = [
        chat_line("a", model_id, "hi"),
        "this is not json",
        chat_line("a", model_id, "dup"),
        chat_line("b", "no-such-model", "hi"),
    ]
    upload = client.files.create(file=("bad.jsonl", "\n".join(lines).encode()), purpose="batch")
    created = client.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    batch = wait_terminal(client, created.id, timeout_s=60)

    assert batch.status == "failed" and batch.failed_at
    assert batch.errors is not None and batch.errors.data is not None
    found = {(e.line, e.code) for e in batch.errors.data}
    assert {(2, "invalid_json_line"), (3, "duplicate_custom_id"), (4, "model_not_found")} <= found
    assert batch.output_file_id is None


def test_the_served_model_is_listed(client: OpenAI, model_id: str) -> None:
    assert model_id in [m.id for m in client.models.list().data]
