"""Per-project quotas on an api of its own: each project at one quota (set for it alone by
``BATCHSTREAM_QUOTA_PROJECTS``), its 429s with their retry-after, the batches that fail at
validation, another project unaffected, and the use shown by ``GET /v1/limits`` and the CLI.

The stack has no aggregator and no worker: validated batches stay in progress with every line
queued, which is what fills the per-model quotas.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from pymongo import MongoClient

from deploy.local import Stack
from tests.support.http_batches import assert_error, create, create_batch, upload
from tests.support.lines import CHAT, chat_line
from tests.support.metrics import metric_value
from tests.support.stacks import OwnStack
from tests.support.waiting import wait_until

MODEL = "quota-model"
PROJECTS: dict[str, dict[str, int]] = {
    "lines": {"queued_lines": 4},
    "tokens": {"enqueued_tokens": 100},
    "bytes": {"stored_bytes": 3000},
    "count": {"batches_in_progress": 2},
    "valid": {"concurrent_validations": 1},
    "view": {"queued_lines": 50, "stored_bytes": 1_000_000},
    "free": {},  # the defaults
    "claude": {"batches_in_progress": 1},  # message batches
}
ENV = {
    "BATCHSTREAM_API_KEYS": ",".join(f"sk-quota-{p}={p}" for p in PROJECTS),
    "BATCHSTREAM_QUOTA_PROJECTS": json.dumps(PROJECTS),
    "BATCHSTREAM_QUOTA_RETRY_AFTER_S": "7",
    "BATCHSTREAM_QUOTA_VALIDATION_RETRY_AFTER_S": "3",
}

Api = Callable[[str], httpx.Client]


@pytest.fixture(scope="module")
def quota_stack(own_stack: OwnStack) -> Iterator[Stack]:
    with own_stack("quotas", ["api"], extra_env=ENV) as stack:
        client: MongoClient[dict[str, Any]] = MongoClient(stack.env()["BATCHSTREAM_MONGO_URI"])
        with client:
            models = client[stack.env()["BATCHSTREAM_MONGO_DATABASE"]].models
            served = {"created": 1, "max_context_length": 4096, "endpoints": [CHAT], "last_seen": time.time()}
            models.update_one({"_id": MODEL}, {"$set": served}, upsert=True)
        yield stack


@pytest.fixture(scope="module")
def quota_db(quota_stack: Stack) -> Iterator[Any]:
    env = quota_stack.env()
    client: MongoClient[dict[str, Any]] = MongoClient(env["BATCHSTREAM_MONGO_URI"])
    with client:
        yield client[env["BATCHSTREAM_MONGO_DATABASE"]]


@pytest.fixture(scope="module")
def api(quota_stack: Stack) -> Iterator[Api]:
    """An HTTP client of a project, by name."""
    made: list[httpx.Client] = []

    def of(project: str) -> httpx.Client:
        root = quota_stack.base_url.removesuffix("/v1")
        made.append(
            httpx.Client(base_url=root, headers={"Authorization": f"Bearer sk-quota-{project}"}, timeout=30)
        )
        return made[-1]

    yield of
    for client in made:
        client.close()


def lines(n: int, tag: str, chars: int = 8) -> bytes:
    return "\n".join(chat_line(f"{tag}{i}", MODEL, "x" * chars) for i in range(n)).encode()


def validated(client: httpx.Client, batch_id: str) -> dict[str, Any]:
    """The batch once validation has ended (in progress or failed)."""

    def poll() -> dict[str, Any] | None:
        batch: dict[str, Any] = client.get(f"/v1/batches/{batch_id}").json()
        return batch if batch["status"] != "validating" else None

    found: dict[str, Any] | None = wait_until(poll, 30, f"batch {batch_id} to be validated")
    assert found is not None
    return found


def assert_quota_429(response: httpx.Response, code: str, limit: str, retry_after: str) -> str:
    assert_error(response, 429, code)
    assert response.headers["retry-after"] == retry_after
    error = response.json()["error"]
    assert error["type"] == limit
    return str(error["message"])


def model_use(view: dict[str, Any]) -> dict[str, Any]:
    return next(m for m in view["models"] if m["model"] == MODEL)


def test_a_batch_past_the_queued_lines_fails_and_a_create_at_the_limit_answers_429(api: Api) -> None:
    lines_api = api("lines")
    assert validated(lines_api, create_batch(lines_api, lines(3, "a")))["status"] == "in_progress"
    failed = validated(lines_api, create_batch(lines_api, lines(2, "b")))
    assert failed["status"] == "failed"
    error = failed["errors"]["data"][0]
    assert error["code"] == "queued_line_limit_exceeded"
    assert MODEL in error["message"] and "Limit: 4 queued lines" in error["message"]
    assert "3 queued lines and this batch adds 2" in error["message"]

    assert validated(lines_api, create_batch(lines_api, lines(1, "c")))["status"] == "in_progress"
    refused = create(lines_api, input_file_id=upload(lines_api, lines(1, "d"))["id"])
    message = assert_quota_429(refused, "quota_exceeded", "queued_lines", "7")
    assert f"Queued line limit reached for {MODEL}" in message and "4 queued lines" in message


def test_a_batch_past_the_enqueued_tokens_fails_with_token_limit_exceeded(api: Api) -> None:
    tokens_api = api("tokens")
    first = validated(tokens_api, create_batch(tokens_api, lines(1, "a", chars=200)))
    assert first["status"] == "in_progress"
    used = model_use(tokens_api.get("/v1/limits").json())["enqueued_tokens"]
    assert used["limit"] == 100 and 50 <= used["used"] <= 100  # 200 characters of prompt, estimated

    failed = validated(tokens_api, create_batch(tokens_api, lines(1, "b", chars=200)))
    assert failed["status"] == "failed"
    error = failed["errors"]["data"][0]
    assert error["code"] == "token_limit_exceeded"
    assert error["message"].startswith(f"Enqueued token limit reached for {MODEL}")
    assert f"has {used['used']} enqueued tokens" in error["message"]
    assert "Limit: 100 enqueued tokens" in error["message"]


def test_an_upload_past_the_stored_bytes_answers_429_until_a_file_goes(api: Api) -> None:
    bytes_api = api("bytes")
    first = upload(bytes_api, b"x" * 2000, "a.txt", "user_data")
    refused = bytes_api.post(
        "/v1/files", files={"file": ("b.txt", b"y" * 1500)}, data={"purpose": "user_data"}
    )
    message = assert_quota_429(refused, "quota_exceeded", "stored_bytes", "7")
    assert "2000 bytes" in message and "Limit: 3000 stored bytes" in message
    assert bytes_api.delete(f"/v1/files/{first['id']}").status_code == 200
    upload(bytes_api, b"y" * 1500, "b.txt", "user_data")


def test_concurrent_creates_stop_at_the_batches_in_progress(api: Api, quota_stack: Stack) -> None:
    metrics = f"http://127.0.0.1:{quota_stack.ports.api_metrics}/metrics"  # not on the api's port
    refusals = metric_value(metrics, "batchstream_api_quota_refusals_total", limit="batches_in_progress")
    file_id = upload(api("count"), lines(1, "a"))["id"]
    clients = [api("count") for _ in range(6)]

    def attempt(n: int) -> httpx.Response:  # each its own metadata: no create is a repeat of another
        return create(clients[n], input_file_id=file_id, metadata={"n": str(n)})

    with ThreadPoolExecutor(len(clients)) as pool:
        answers = list(pool.map(attempt, range(len(clients))))
    created = [a for a in answers if a.status_code == 200]
    assert len(created) <= 2  # never past the limit, however the creates interleave
    for refused in (a for a in answers if a.status_code != 200):
        assert_quota_429(refused, "quota_exceeded", "batches_in_progress", "7")
    n = len(clients)
    while len(created) < 2:  # racing creates at the limit may all be refused: the next ones pass
        n += 1
        answer = create(clients[0], input_file_id=file_id, metadata={"n": str(n)})
        assert answer.status_code == 200, answer.text
        created.append(answer)
    refused = create(clients[0], input_file_id=file_id, metadata={"n": "last"})
    message = assert_quota_429(refused, "quota_exceeded", "batches_in_progress", "7")
    assert "Limit: 2 batches in progress" in message
    listed = {b["id"] for b in api("count").get("/v1/batches").json()["data"]}
    assert listed == {a.json()["id"] for a in created}  # the refused ones left nothing
    refused_now = sum(a.status_code == 429 for a in answers) + 1
    assert metric_value(metrics, "batchstream_api_quota_refusals_total", limit="batches_in_progress") == (
        refusals + refused_now
    )


def test_a_create_while_validations_fill_the_limit_answers_429(api: Api, quota_db: Any) -> None:
    valid_api = api("valid")
    file_id = upload(valid_api, lines(1, "a"))["id"]
    now = int(time.time())
    stuck = {"_id": "batch_quota_stuck", "project": "valid", "status": "validating", "endpoint": CHAT}
    quota_db.batches.insert_one(
        {**stuck, "input_file_id": file_id, "created_at": now, "expires_at": now + 86_400}
    )
    key = {"Idempotency-Key": "quota-retry"}
    refused = create(valid_api, input_file_id=file_id, headers=key)
    message = assert_quota_429(refused, "rate_limit_exceeded", "concurrent_validations", "3")
    assert "Limit: 1 concurrent validations" in message
    quota_db.batches.delete_one({"_id": "batch_quota_stuck"})
    retried = create(valid_api, input_file_id=file_id, headers=key)  # the refusal kept no claim
    assert retried.status_code == 200, retried.text
    assert valid_api.get(f"/v1/batches/{retried.json()['id']}").status_code == 200


def test_a_message_batch_past_a_quota_answers_anthropic_s_429_and_keeps_no_file(api: Api) -> None:
    claude = api("claude")
    ask = {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]}
    body = {"requests": [{"custom_id": "q1", "params": ask}]}
    assert claude.post("/v1/messages/batches", json=body).status_code == 200  # the one in progress
    files_before = claude.get("/v1/files").json()["data"]
    refused = claude.post("/v1/messages/batches", json=body)
    assert refused.status_code == 429 and refused.headers["retry-after"] == "7"
    error = refused.json()
    assert error["type"] == "error" and error["error"]["type"] == "rate_limit_error"
    assert "Limit: 1 batches in progress" in error["error"]["message"]
    assert claude.get("/v1/files").json()["data"] == files_before  # its input file went too


def test_another_project_is_not_limited(api: Api) -> None:
    free = api("free")
    for n in range(3):  # past the lines, tokens and batches quotas of the projects above
        batch = validated(free, create_batch(free, lines(5, f"f{n}", chars=200)))
        assert batch["status"] == "in_progress"


def test_limits_and_the_cli_show_the_projects_use(api: Api, quota_stack: Stack) -> None:
    view_api = api("view")
    stored = upload(view_api, lines(3, "a"))
    created = create(view_api, input_file_id=stored["id"])
    assert validated(view_api, created.json()["id"])["status"] == "in_progress"

    view = view_api.get("/v1/limits").json()
    assert view["object"] == "limits" and view["project"] == "view"
    assert view["stored_bytes"] == {"limit": 1_000_000, "used": stored["bytes"]}
    assert view["batches_in_progress"] == {"limit": 1000, "used": 1}
    assert view["concurrent_validations"] == {"limit": 32, "used": 0}
    assert model_use(view)["queued_lines"] == {"limit": 50, "used": 3}
    assert model_use(view)["enqueued_tokens"]["limit"] is None  # unlimited

    cli = [
        sys.executable,
        "-m",
        "services.client",
        "--base-url",
        quota_stack.base_url,
        "--api-key",
        "sk-quota-view",
    ]
    table = subprocess.run([*cli, "limits"], capture_output=True, text=True, timeout=60, check=True).stdout
    assert MODEL in table and "3 / 50" in table and f"{stored['bytes']} / 1000000" in table
