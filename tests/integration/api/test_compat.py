"""A client written for the batch API batchstream replaces ("batchgen") works unchanged.

Plain HTTP, as that API's reference documents it: ``/health``, ``/v1/models/{id}`` with
``max_context_length``, an upload whose file object carries ``checksum``, a create with only
``input_file_id`` (``endpoint`` and ``completion_window`` default), the status flow with
``started_at`` and the singular ``error``, and downloads sent as attachments with their filename.
"""

from __future__ import annotations

import hashlib
import json
from urllib.parse import quote

import httpx

from deploy.local.stack import Stack
from tests.support.http_batches import upload, wait_http_terminal
from tests.support.lines import chat_request, jsonl

FLOW = ["validating", "in_progress", "finalizing", "completed"]


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def test_health_and_model_as_the_old_api(stack: Stack, http: httpx.Client, model_id: str) -> None:
    health = httpx.get(stack.base_url.removesuffix("/v1") + "/health", timeout=10)
    assert health.status_code == 200 and health.json()["status"] == "healthy"
    model = http.get(f"/models/{model_id}")
    assert model.status_code == 200
    assert model.json()["id"] == model_id and model.json()["max_context_length"] > 0
    assert http.get("/models/no-such-model").status_code == 404


def test_the_old_clients_flow(http: httpx.Client, model_id: str) -> None:
    data = jsonl([chat_request(f"r{i}", model_id, max_tokens=4) for i in range(3)])
    uploaded = upload(http, data, "requests.jsonl", prefix="")
    assert uploaded["checksum"] == sha256(data)
    assert http.get(f"/files/{uploaded['id']}").json()["checksum"] == sha256(data)

    created = http.post("/batches", json={"input_file_id": uploaded["id"]})
    assert created.status_code == 200, created.text
    batch = created.json()
    assert batch["endpoint"] == "/v1/chat/completions" and batch["completion_window"] == "24h"
    assert batch["status"] == "validating" and batch["started_at"] is None and batch["error"] is None

    seen: list[str] = [batch["status"]]
    done = wait_http_terminal(http, batch["id"], 300, prefix="", seen=seen)
    assert done["status"] == "completed", done
    assert seen == [s for s in FLOW if s in seen]  # never backwards
    assert done["started_at"] == done["in_progress_at"] and done["started_at"] is not None
    assert done["error"] is None and done["errors"] is None
    assert done["request_counts"] == {"total": 3, "completed": 3, "failed": 0}

    content = http.get(f"/files/{done['output_file_id']}/content")
    assert content.status_code == 200
    output = http.get(f"/files/{done['output_file_id']}").json()
    assert output["checksum"] == sha256(content.content) and output["bytes"] == len(content.content)
    disposition = content.headers["content-disposition"]
    assert disposition == f'attachment; filename="{output["filename"]}"'
    assert sorted(json.loads(line)["custom_id"] for line in content.text.splitlines()) == ["r0", "r1", "r2"]


def test_a_failed_batch_carries_its_error(http: httpx.Client, model_id: str) -> None:
    data = b"not json\n" + jsonl([chat_request("ok", model_id)])
    uploaded = upload(http, data, "bad.jsonl", prefix="")
    batch = http.post("/batches", json={"input_file_id": uploaded["id"]}).json()
    done = wait_http_terminal(http, batch["id"], 300, prefix="", seen=[])
    assert done["status"] == "failed"
    assert done["error"] == done["errors"]["data"][0]
    assert done["error"]["code"] == "invalid_json_line" and done["error"]["line"] == 1
    assert done["started_at"] is None


def test_a_download_names_a_non_ascii_file_safely(http: httpx.Client, model_id: str) -> None:
    name = "résumé.jsonl"
    uploaded = upload(http, jsonl([chat_request("a", model_id)]), name, prefix="")
    assert uploaded["filename"] == name
    content = http.get(f"/files/{uploaded['id']}/content")
    assert content.headers["content-disposition"] == (
        "attachment; filename=\"r_sum_.jsonl\"; filename*=UTF-8''" + quote(name, safe="")
    )
