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
        ("/v1/score", {"queries": "what is a cat", "documents": ["an animal", "a city"]}),
        ("/v1/score", {"queries": ["a", "b"], "items": ["c", "d"]}),
        ("/v1/score", {"text_1": "q", "text_2": "d", "truncate_prompt_tokens": 64}),
        ("/v1/score", {"data_1": "", "data_2": {"content": [{"type": "text", "text": "d"}]}}),
        ("/v1/rerank", {"query": "what is a cat", "documents": ["an animal", "a city"], "top_n": 1}),
        ("/v1/rerank", {"query": "q", "documents": "one document"}),
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
        ("/v1/score", {"queries": "q"}, [("invalid_request", "body.documents")]),
        ("/v1/score", {"text_1": "q", "documents": ["d"]}, [("invalid_request", "body.queries")]),
        ("/v1/score", {"items": ["d"]}, [("invalid_request", "body.queries")]),
        ("/v1/score", {}, [("invalid_request", "body.queries")]),
        ("/v1/score", {"queries": "q", "documents": []}, [("invalid_request", "body.documents")]),
        ("/v1/score", {"text_1": ["a", "b"], "text_2": ["c"]}, [("invalid_request", "body.text_2")]),
        ("/v1/score", {"queries": "q", "documents": [1]}, [("invalid_request", "body.documents")]),
        ("/v1/rerank", {"documents": ["d"]}, [("invalid_request", "body.query")]),
        ("/v1/rerank", {"query": "q"}, [("invalid_request", "body.documents")]),
        (
            "/v1/rerank",
            {"query": ["q"], "documents": ["d"], "top_n": -1},
            [("invalid_request", "body.query"), ("invalid_request", "body.top_n")],
        ),
    ],
)
async def test_bad_bodies_name_each_bad_field_once(
    endpoint: str, body: dict[str, Any], expected: list[tuple[str, str]]
) -> None:
    assert await errors_for(endpoint, body) == expected


async def messages_for(endpoint: str, body: dict[str, Any]) -> list[str]:
    raw = json.dumps({"custom_id": "a", "method": "POST", "url": endpoint, "body": {"model": "m", **body}})
    report = await InputValidator(endpoint, served(m=None), 10, 10).run(file_request_lines([raw.encode()]))
    return [e.message for e in report.errors]


async def test_a_score_line_missing_its_documents_says_which_field() -> None:
    assert await messages_for("/v1/score", {"queries": "q"}) == [
        "The body must contain 'documents' for /v1/score."
    ]


async def test_n_to_n_scores_need_as_many_of_each() -> None:
    assert await messages_for("/v1/score", {"text_1": ["a", "b"], "text_2": ["c"]}) == [
        "body.text_2: Value error, 2 text_1 need as many text_2, not 1."
    ]
