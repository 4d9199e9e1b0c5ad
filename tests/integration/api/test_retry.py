"""``POST /v1/batches/{id}/retry``: a new batch of a finished batch's failed lines."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from openai import OpenAI

from tests.support.http_batches import create, upload, wait_http_terminal
from tests.support.lines import chat_line

TOO_LONG = "hello " * 5000  # over the tiny model's context: the engine refuses it (400)


@pytest.fixture(scope="module")
def parent(http: httpx.Client, model_id: str) -> dict[str, Any]:
    """A completed batch with two engine-refused lines among four, metadata and a default."""
    lines = [
        chat_line("ok-0", model_id, "hi", max_tokens=2),
        chat_line("bad-1", model_id, TOO_LONG, max_tokens=2),
        chat_line("ok-2", model_id, "hi", max_tokens=2),
        chat_line("bad-3", model_id, TOO_LONG, max_tokens=2),
    ]
    file_id = upload(http, "\n".join(lines).encode(), prefix="")["id"]
    made = create(
        http, prefix="", input_file_id=file_id, metadata={"team": "eval"}, temperature=0.5, priority=3
    )
    assert made.status_code == 200, made.text
    batch = wait_http_terminal(http, made.json()["id"], 120, prefix="")
    assert batch["status"] == "completed" and batch["request_counts"]["failed"] == 2
    return {**batch, "lines": lines}


def test_a_retry_runs_exactly_the_failed_lines_with_the_parents_settings(
    http: httpx.Client, parent: dict[str, Any]
) -> None:
    answer = http.post(f"/batches/{parent['id']}/retry", json={})
    assert answer.status_code == 200, answer.text
    child = answer.json()
    assert child["metadata"] == {"team": "eval", "retry_of": parent["id"]}
    assert (child["endpoint"], child["priority"], child["temperature"]) == (parent["endpoint"], 3, 0.5)
    content = http.get(f"/files/{child['input_file_id']}/content").text
    assert content == parent["lines"][1] + "\n" + parent["lines"][3] + "\n"  # byte for byte, in order
    done = wait_http_terminal(http, child["id"], 120, prefix="")
    assert done["request_counts"] == {"total": 2, "completed": 0, "failed": 2}


def test_codes_choose_the_lines_and_a_choice_of_none_is_a_clear_400(
    http: httpx.Client, parent: dict[str, Any], client: OpenAI
) -> None:
    by_status = http.post(f"/batches/{parent['id']}/retry", json={"codes": ["400"]})
    assert by_status.status_code == 200, by_status.text
    none = http.post(f"/batches/{parent['id']}/retry", json={"codes": ["batch_expired"]})
    assert none.status_code == 400
    assert none.json()["error"]["code"] == "no_error_lines" and none.json()["error"]["param"] == "codes"
    unknown_field = http.post(f"/batches/{parent['id']}/retry", json={"code": "400"})
    assert unknown_field.status_code == 400


def test_only_a_finished_batch_of_ones_own_project_is_retried(
    http: httpx.Client, parent: dict[str, Any], other_client: OpenAI, unserved_model: str
) -> None:
    file_id = upload(http, chat_line("waits", unserved_model, "hi").encode(), prefix="")["id"]
    running = create(http, prefix="", input_file_id=file_id).json()
    refused = http.post(f"/batches/{running['id']}/retry")
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "batch_not_finished"
    http.post(f"/batches/{running['id']}/cancel")
    with pytest.raises(Exception, match="404"):
        other_client.post(f"/batches/{parent['id']}/retry", body={}, cast_to=dict)


def test_a_failed_first_line_after_a_bom_is_retried_without_the_bom(
    http: httpx.Client, model_id: str
) -> None:
    first = chat_line("bad-0", model_id, TOO_LONG, max_tokens=2)
    content = b"\xef\xbb\xbf" + "\n".join([first, chat_line("ok-1", model_id, "hi", max_tokens=2)]).encode()
    made = create(http, prefix="", input_file_id=upload(http, content, prefix="")["id"])
    parent = wait_http_terminal(http, made.json()["id"], 120, prefix="")
    assert parent["request_counts"]["failed"] == 1
    child = http.post(f"/batches/{parent['id']}/retry").json()
    assert http.get(f"/files/{child['input_file_id']}/content").text == first + "\n"


def test_a_deleted_error_file_is_a_404_not_no_error_lines(http: httpx.Client, model_id: str) -> None:
    lines = [chat_line("bad", model_id, TOO_LONG, max_tokens=2)]
    made = create(http, prefix="", input_file_id=upload(http, "\n".join(lines).encode(), prefix="")["id"])
    parent = wait_http_terminal(http, made.json()["id"], 120, prefix="")
    assert http.delete(f"/files/{parent['error_file_id']}").status_code == 200
    gone = http.post(f"/batches/{parent['id']}/retry")
    assert gone.status_code == 404, gone.text
