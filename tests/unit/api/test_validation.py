"""The input validator reports every bad line with OpenAI's codes, and passes good files."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from services.api.service.validation import InputValidator, ValidationReport

ENDPOINT = "/v1/chat/completions"
MESSAGES = [{"role": "user", "content": "hi"}]


def line(custom_id: str = "a", **overrides: Any) -> bytes:
    item: dict[str, Any] = {
        "custom_id": custom_id,
        "method": "POST",
        "url": ENDPOINT,
        "body": {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    }
    item.update(overrides)
    return json.dumps(item).encode()


async def _lines(items: list[bytes]) -> AsyncIterator[bytes]:
    for item in items:
        yield item


async def validate(items: list[bytes], max_lines: int = 100, max_errors: int = 100) -> ValidationReport:
    validator = InputValidator(ENDPOINT, {"m": 1024, "other": None}, max_lines, max_errors)
    return await validator.run(_lines(items))


def codes(report: ValidationReport) -> list[tuple[int | None, str, str | None]]:
    return [(e.line, e.code, e.param) for e in report.errors]


async def test_a_good_file_passes_with_its_model_and_line_count() -> None:
    report = await validate([line("a"), b"", line("b")])
    assert report.ok
    assert report.lines == 2
    assert report.model == "m"


async def test_every_bad_line_is_reported_with_its_number() -> None:
    report = await validate(
        [
            b"{not json",
            line("a", url="/v1/embeddings"),
            line("a"),
            line("c", body={"model": "m", "messages": MESSAGES, "stream": True}),
            line("d", body={"model": "nope", "messages": MESSAGES}),
            line("e", body={"model": "other", "messages": MESSAGES}),
            json.dumps(
                {"method": "POST", "url": ENDPOINT, "body": {"model": "m", "messages": MESSAGES}}
            ).encode(),
            line("f", body={"model": "m"}),
            line("g", body={"model": "m", "messages": "hi"}),
            line("h", body={"model": "m", "messages": MESSAGES, "max_tokens": 0}),
            line("i", body={"model": "m", "messages": MESSAGES, "max_tokens": 5000}),
        ]
    )
    assert not report.ok
    assert codes(report) == [
        (1, "invalid_json_line", None),
        (2, "invalid_url", "url"),
        (3, "duplicate_custom_id", "custom_id"),
        (4, "streaming_unsupported", "body.stream"),
        (5, "model_not_found", "body.model"),
        (5, "mismatched_model", "body.model"),
        (6, "mismatched_model", "body.model"),
        (7, "missing_required_parameter", "custom_id"),
        (8, "invalid_request", "body.messages"),
        (9, "invalid_request", "body.messages"),
        (10, "invalid_request", "body.max_tokens"),
        (11, "token_limit_exceeded", "body.max_tokens"),
    ]


async def test_an_empty_file_fails() -> None:
    report = await validate([b"", b"  "])
    assert codes(report) == [(None, "empty_file", None)]


async def test_too_many_lines_fail_the_batch() -> None:
    report = await validate([line(str(i)) for i in range(4)], max_lines=3)
    assert codes(report) == [(None, "too_many_tasks", None)]


async def test_reported_errors_are_capped_but_all_are_counted() -> None:
    report = await validate([b"x"] * 10, max_errors=3)
    assert len(report.errors) == 3
    assert report.error_count == 10
