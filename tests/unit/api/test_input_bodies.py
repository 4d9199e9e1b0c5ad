"""Each endpoint's body is checked by its typed model, chosen by the batch's url."""

from __future__ import annotations

import json
from typing import Any

import pytest

from services.api.service.validation import InputValidator
from tests.support.lines import file_request_lines, served


async def errors_for(endpoint: str, body: dict[str, Any]) -> list[tuple[str, str | None]]:
    raw = json.dumps({"custom_id": "a", "method": "POST", "url": endpoint, "body": {"model": "m", **body}})
    report = await InputValidator(endpoint, served(m=None), 10, 10).run(file_request_lines([raw.encode()]))
    return [(e.code, e.param) for e in report.errors]


@pytest.mark.parametrize(
    ("endpoint", "body"),
    [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "n": 2}),
        ("/v1/completions", {"prompt": "once upon"}),
        ("/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 4}),
        ("/v1/embeddings", {"input": ["a", "b"], "dimensions": 8}),
    ],
)
async def test_good_bodies_pass(endpoint: str, body: dict[str, Any]) -> None:
    assert await errors_for(endpoint, body) == []


@pytest.mark.parametrize(
    ("endpoint", "body", "expected"),
    [
        ("/v1/completions", {"prompt": ""}, [("invalid_request", "body.prompt")]),
        ("/v1/embeddings", {"input": []}, [("invalid_request", "body.input")]),
        ("/v1/embeddings", {}, [("invalid_request", "body.input")]),
        ("/v1/chat/completions", {"messages": ["hi"]}, [("invalid_request", "body.messages")]),
        (
            "/v1/chat/completions",
            {"messages": [], "n": True, "max_completion_tokens": 1.5},
            [
                ("invalid_request", "body.messages"),
                ("invalid_request", "body.max_completion_tokens"),
                ("invalid_request", "body.n"),
            ],
        ),
    ],
)
async def test_bad_bodies_name_each_bad_field_once(
    endpoint: str, body: dict[str, Any], expected: list[tuple[str, str]]
) -> None:
    assert await errors_for(endpoint, body) == expected
