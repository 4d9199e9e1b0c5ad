"""List pages stop at a byte budget (at least one item each) and ``after`` paging reads on to the
end; an unknown create parameter is a 400 naming it, while every field the SDK sends is taken."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from openai.types import batch_create_params
from pydantic_core import to_json

from services.api.errors import install_error_handlers
from services.api.schemas import BatchCreateParams
from services.api.service.error_lines import ErrorLinesService, describe
from services.api.service.files import page
from shared.protocol.openai import FileObject
from tests.unit.api.test_console_views import FakePartialOfLines, error_lines


def files(count: int, name_chars: int) -> list[FileObject]:
    return [
        FileObject(id=f"file-{n:04}", bytes=1, created_at=n, filename="f" * name_chars, purpose="batch")
        for n in range(count)
    ]


def walk(items: list[FileObject], limit: int, max_bytes: int) -> list[list[FileObject]]:
    """Every page a client reads with ``after=<last_id>`` until ``has_more`` is false (a store
    that answers up to ``limit + 1`` items after the anchor, as the stores do)."""
    pages, start = [], 0
    while True:
        listed = page(items[start : start + limit + 1], limit, max_bytes)
        pages.append(listed.data)
        if not listed.has_more:
            return pages
        assert listed.data, "a page that says has_more must hold an item"
        start = [i.id for i in items].index(listed.last_id) + 1


def test_a_page_within_the_budget_is_the_limit() -> None:
    listed = page(files(101, 10), 100, 1024 * 1024)
    assert len(listed.data) == 100 and listed.has_more
    assert (listed.first_id, listed.last_id) == ("file-0000", "file-0099")


def test_a_page_over_the_budget_is_shorter_and_says_has_more() -> None:
    items = files(100, 4000)  # ~4.2 KB each
    listed = page(items, 100, 64 * 1024)
    assert 1 < len(listed.data) < 100 and listed.has_more
    assert len(to_json(listed.data)) <= 64 * 1024
    assert listed.last_id == listed.data[-1].id


def test_an_item_larger_than_the_budget_is_still_listed_alone() -> None:
    listed = page(files(3, 10_000), 100, 1024)
    assert [i.id for i in listed.data] == ["file-0000"] and listed.has_more


@pytest.mark.parametrize("budget", [1, 9_000, 50_000, 10**9])
def test_paging_after_the_last_id_reaches_every_item_once_in_order(budget: int) -> None:
    items = files(57, 2000)
    pages = walk(items, 20, budget)
    assert [i.id for p in pages for i in p] == [i.id for i in items]
    assert all(len(to_json(p)) <= budget for p in pages if len(p) > 1)


async def test_error_line_pages_stop_at_the_budget_and_next_offset_reads_on() -> None:
    lines = error_lines(30)
    largest = max(len(to_json(describe(1, raw))) for raw in lines)
    service = ErrorLinesService(FakePartialOfLines(lines), max_bytes=4 * largest)  # type: ignore[arg-type]
    seen: list[str] = []
    offset: int | None = 0
    while offset is not None:
        got = await service.page("p", "b", offset=offset, limit=500)
        assert 3 <= len(got.data) <= 4 or got.next_offset is None
        seen += [line.custom_id for line in got.data]
        offset = got.next_offset
    assert seen == [f"id-{i}" for i in range(30)]


def strict_app() -> TestClient:
    app = FastAPI()
    install_error_handlers(app)

    @app.post("/v1/batches")
    async def create(params: BatchCreateParams) -> dict[str, Any]:
        return params.model_dump()

    return TestClient(app)


CREATE = {"input_file_id": "file-x", "endpoint": "/v1/chat/completions", "completion_window": "24h"}


def test_an_unknown_create_parameter_is_a_400_naming_it() -> None:
    answer = strict_app().post("/v1/batches", json={**CREATE, "mixed_modles": True})
    assert answer.status_code == 400
    assert answer.json() == {
        "error": {
            "message": "Unrecognized request argument supplied: mixed_modles",
            "type": "invalid_request_error",
            "param": "mixed_modles",
            "code": "unknown_parameter",
        }
    }


def test_unknown_parameters_are_named_before_other_errors_and_cut_short() -> None:
    answer = strict_app().post("/v1/batches", json={"x" * 15_000: 1, "temprature": 0.5, "top_p": 9})
    error = answer.json()["error"]
    assert (answer.status_code, error["code"]) == (400, "unknown_parameter")
    assert error["message"].startswith("Unrecognized request arguments supplied: xxx")
    assert len(error["message"]) < 300 and len(error["param"]) < 250
    nested = strict_app().post(
        "/v1/batches", json={**CREATE, "output_expires_after": {"seconds": 3600, "x": 1}}
    )
    assert nested.json()["error"]["param"] == "output_expires_after.x"


def test_every_field_the_openai_sdk_sends_and_every_extension_is_taken() -> None:
    sdk_fields = set(batch_create_params.BatchCreateParams.__annotations__)
    assert sdk_fields <= set(BatchCreateParams.model_fields)
    extensions = {"max_decoding_length": 8, "temperature": 0.5, "priority": 3, "prefix_order": False}
    answer = strict_app().post(
        "/v1/batches",
        json={
            **CREATE,
            **extensions,
            "mixed_models": True,
            "metadata": {"a": "b"},
            "output_expires_after": None,
        },
    )
    assert answer.status_code == 200, answer.text
