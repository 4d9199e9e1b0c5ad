"""Answers stay small whatever a client's lines echo, and create refuses what it does not know.

A misspelt create parameter is a 400 naming it; the unmodified SDK's create works, with the
extensions too. A file of 1,000 lines naming a 15 KB model, 100 of them with 15 KB custom_ids used
twice, fails its batch (as it must); the batch object stays within the errors' byte cap and a list
of two such batches within the list budget. (Pages cut short by the budget, and paging on from
them, are the corpus stack's: tests/integration/api/test_corpus.py.)
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from openai import OpenAI

from deploy.local import Stack
from shared.settings import ApiSettings
from tests.support.http_batches import assert_error, create, upload, wait_http_terminal
from tests.support.lines import chat_request, jsonl

pytestmark = pytest.mark.e2e

LINES = 1000
LONG = 15_000
REPEATED = 100  # lines with a long custom_id, each used by two lines
ERROR_BYTES = ApiSettings.model_fields["max_reported_error_bytes"].default
LIST_BYTES = ApiSettings.model_fields["max_list_bytes"].default
BATCH_OVERHEAD = 4096  # a batch object's own fields and its ``error`` (the first entry again)


def echoing_lines() -> bytes:
    model = "m" * LONG
    ids = [f"{'c' * LONG}-{n // 2}" if n < REPEATED else f"id-{n}" for n in range(LINES)]
    return jsonl(chat_request(custom_id, model, "hi") for custom_id in ids)


@pytest.fixture(scope="module")
def key(stack: Stack) -> str:
    """A project of this module's own: its list holds only the batches made here."""
    return stack.create_key(f"bounds-{uuid.uuid4().hex[:8]}")


@pytest.fixture(scope="module")
def api(stack: Stack, key: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=stack.base_url, headers={"Authorization": f"Bearer {key}"}, timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def echoing_batches(api: httpx.Client) -> list[dict[str, Any]]:
    """Two failed batches of the echoing file (one upload; metadata keeps the creates apart)."""
    file_id = upload(api, echoing_lines(), prefix="")["id"]
    ids = []
    for n in range(2):
        created = create(api, prefix="", input_file_id=file_id, metadata={"n": str(n)})
        assert created.status_code == 200, created.text
        ids.append(created.json()["id"])
    return [wait_http_terminal(api, batch_id, 60, prefix="") for batch_id in ids]


def test_a_misspelt_create_parameter_is_a_400_naming_it(api: httpx.Client, client: OpenAI) -> None:
    file_id = upload(api, b"x\n", prefix="")["id"]
    answer = create(api, prefix="", input_file_id=file_id, mixed_modles=True)
    assert_error(answer, 400, "unknown_parameter", "mixed_modles")
    assert answer.json()["error"]["message"] == "Unrecognized request argument supplied: mixed_modles"
    with pytest.raises(openai.BadRequestError) as refused:
        client.batches.create(
            input_file_id=file_id,
            endpoint="/v1/chat/completions",
            completion_window="24h",
            extra_body={"temprature": 0.2},
        )
    assert refused.value.code == "unknown_parameter" and refused.value.param == "temprature"


def test_the_openai_sdk_creates_with_what_it_sends_and_the_extensions(
    api: httpx.Client, key: str, stack: Stack
) -> None:
    client = OpenAI(base_url=stack.base_url, api_key=key, max_retries=0)
    file_id = client.files.create(file=("in.jsonl", b"x\n"), purpose="batch").id
    plain = client.batches.create(
        input_file_id=file_id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"sdk": "plain"},
        output_expires_after={"anchor": "created_at", "seconds": 3600},
    )
    extended = client.batches.create(
        input_file_id=file_id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        extra_body={"temperature": 0.2, "priority": 5, "prefix_order": False, "mixed_models": True},
    )
    assert plain.status == extended.status == "validating"
    assert extended.model_extra is not None and extended.model_extra["priority"] == 5


def test_a_batch_of_lines_echoing_long_strings_stays_small(
    api: httpx.Client, echoing_batches: list[dict[str, Any]]
) -> None:
    batch_id = echoing_batches[0]["id"]
    answer = api.get(f"/batches/{batch_id}")
    assert len(answer.content) <= ERROR_BYTES + BATCH_OVERHEAD, len(answer.content)
    batch = answer.json()
    assert batch["status"] == "failed"
    data = batch["errors"]["data"]
    assert {e["code"] for e in data[:-1]} == {"model_not_found", "duplicate_custom_id"}
    assert all(re.search(r"… \(150\d\d characters\)", e["message"]) for e in data[:-1]), data[:3]
    assert max(len(e["message"]) for e in data) < 400
    errors_in_all = LINES + REPEATED // 2  # every line's model, every second long custom_id
    assert data[-1]["code"] == "errors_truncated" and data[-1]["line"] is None
    assert data[-1]["message"].startswith(f"The input file has {errors_in_all} errors in all")
    assert batch["error"] == data[0]


def test_a_list_of_such_batches_stays_within_its_budget(
    api: httpx.Client, key: str, echoing_batches: list[dict[str, Any]]
) -> None:
    answer = api.get("/batches", params={"limit": 100})
    assert answer.status_code == 200
    assert len(answer.content) <= LIST_BYTES + 1024, len(answer.content)
    listed = answer.json()
    assert {b["id"] for b in echoing_batches} <= {b["id"] for b in listed["data"]}
    assert listed["has_more"] is False
    sdk = OpenAI(base_url=str(api.base_url), api_key=key, max_retries=0)
    assert [b.id for b in sdk.batches.list(limit=100)] == [b["id"] for b in listed["data"]]
