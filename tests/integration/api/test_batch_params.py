"""Every batch-level parameter is checked at create: a 400 in OpenAI's error shape naming it;
and a line no parser can take fails its batch as that line's ``invalid_json_line``."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.support.http_batches import assert_error, create, upload, wait_http_terminal
from tests.support.lines import chat_request, jsonl


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"max_decoding_length": -1}, "max_decoding_length"),
        ({"max_decoding_length": 0}, "max_decoding_length"),
        ({"max_decoding_length": "10"}, "max_decoding_length"),
        ({"max_decoding_length": 1.5}, "max_decoding_length"),
        ({"max_context_length": 0}, "max_context_length"),
        ({"max_context_length": True}, "max_context_length"),
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": 2.5}, "temperature"),
        ({"temperature": "hot"}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_p": 1.01}, "top_p"),
        ({"top_k": 0}, "top_k"),
        ({"top_k": -2}, "top_k"),
        ({"completion_window": 24}, "completion_window"),
        ({"output_expires_after": {"anchor": "created_at", "seconds": 10}}, "output_expires_after.seconds"),
        ({"output_expires_after": {"anchor": "now", "seconds": 3600}}, "output_expires_after.anchor"),
        ({"output_expires_after": "1h"}, "output_expires_after"),
        ({"input_file_id": 5}, "input_file_id"),
        ({"endpoint": ["/v1/chat/completions"]}, "endpoint"),
    ],
)
def test_a_bad_batch_parameter_is_400_naming_it(
    http: httpx.Client, fields: dict[str, Any], param: str
) -> None:
    body = {"input_file_id": "file-any", **fields}
    assert_error(create(http, prefix="", **body), 400, "invalid_value", param)


@pytest.mark.parametrize(
    ("metadata", "code"),
    [([["k", "v"]], "invalid_type"), ({"k": 1}, "invalid_type"), ({"k" * 65: "v"}, "invalid_value")],
)
def test_a_bad_metadata_shape_is_400(http: httpx.Client, model_id: str, metadata: Any, code: str) -> None:
    file = upload(http, jsonl([chat_request("a", model_id)]), prefix="")
    assert_error(create(http, prefix="", input_file_id=file["id"], metadata=metadata), 400, code, "metadata")


def test_valid_extremes_are_accepted(http: httpx.Client, model_id: str) -> None:
    file = upload(http, jsonl([chat_request("a", model_id)]), prefix="")
    fields: dict[str, Any] = {
        "max_decoding_length": 1,
        "temperature": 0,
        "top_p": 1,
        "top_k": -1,
        "max_context_length": 1,
    }
    response = create(http, prefix="", input_file_id=file["id"], **fields)
    assert response.status_code == 200, response.text
    assert {k: response.json()[k] for k in fields} == fields
    http.post(f"/batches/{response.json()['id']}/cancel")


def test_a_line_that_breaks_the_parser_is_that_lines_error(http: httpx.Client, model_id: str) -> None:
    deep = b"[" * 100_000 + b"]" * 100_000  # the parser raises RecursionError, not a decoding error
    data = (
        jsonl([chat_request("ok", model_id)]) + b"\n" + deep + b"\n" + jsonl([chat_request("ok2", model_id)])
    )
    file = upload(http, data, prefix="")
    batch = create(http, prefix="", input_file_id=file["id"]).json()

    done = wait_http_terminal(http, batch["id"], 60, prefix="")
    assert done["status"] == "failed", done
    assert [(e["code"], e["line"]) for e in done["errors"]["data"]] == [("invalid_json_line", 2)]
