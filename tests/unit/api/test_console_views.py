"""The console's read-only views: how an error line is described and searched, the status filter,
and which workers count as alive."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from services.api.page_sizes import BATCHES_PAGE_MAX, ERROR_LINES_PAGE_MAX, FILES_PAGE_MAX
from services.api.routes.batches import parse_statuses
from services.api.routes.console import console_config
from services.api.service.error_lines import ErrorLinesService, describe, matches
from shared.errors import InvalidRequest
from shared.stores.models import WORKER_ALIVE_S, worker_statuses

ENGINE_REFUSED = {
    "id": "batch_req_1",
    "custom_id": "too-long-7",
    "response": {
        "status_code": 400,
        "request_id": "req_1",
        "body": {
            "error": {"message": "Input too long", "type": "BadRequestError", "param": None, "code": 400}
        },
    },
    "error": None,
}
NEVER_RAN = {
    "id": "batch_req_2",
    "custom_id": "late-1",
    "response": None,
    "error": {"code": "batch_cancelled", "message": "This request was not run: the batch was cancelled."},
}


def test_an_engine_refusal_is_named_by_its_type_and_status() -> None:
    line = describe(3, json.dumps(ENGINE_REFUSED).encode())
    assert (line.line, line.custom_id, line.code, line.status_code) == (
        3,
        "too-long-7",
        "BadRequestError",
        400,
    )
    assert line.message == "Input too long"
    assert line.raw == ENGINE_REFUSED


def test_a_line_that_never_ran_is_named_by_its_error_code() -> None:
    line = describe(1, json.dumps(NEVER_RAN).encode())
    assert (line.code, line.status_code) == ("batch_cancelled", None)
    assert line.message.startswith("This request was not run")


def test_search_by_custom_id_fragment_and_by_code_or_status() -> None:
    refused = describe(1, json.dumps(ENGINE_REFUSED).encode())
    never_ran = describe(2, json.dumps(NEVER_RAN).encode())
    assert matches(refused, "too-long", None) and not matches(never_ran, "too-long", None)
    assert matches(refused, None, "400") and matches(refused, None, "badrequesterror")
    assert matches(never_ran, None, "batch_cancelled") and not matches(refused, None, "batch_cancelled")
    assert not matches(refused, "too-long", "batch_cancelled")
    assert matches(never_ran, None, None)


def test_the_status_filter_takes_known_statuses_and_names_an_unknown_one() -> None:
    assert parse_statuses(None) is None and parse_statuses(" ") is None
    assert parse_statuses("in_progress, completed") == {"in_progress", "completed"}
    with pytest.raises(InvalidRequest, match="'running'") as refused:
        parse_statuses("completed,running")
    assert refused.value.param == "status"


def test_a_worker_is_alive_until_its_heartbeat_is_three_intervals_old() -> None:
    now = 1_000_000.0
    doc = {
        "workers": [{"id": "a:1", "last_seen": now - WORKER_ALIVE_S - 1}, {"id": "b:2", "last_seen": now - 1}]
    }
    assert [(w.id, w.alive) for w in worker_statuses(doc, now)] == [("b:2", True), ("a:1", False)]
    assert worker_statuses({}, now) == []


def test_the_new_batch_form_gets_every_default_with_its_bounds() -> None:
    config = console_config()
    assert set(config["defaults"]) == {
        "max_decoding_length",
        "max_context_length",
        "temperature",
        "top_p",
        "top_k",
    }
    temperature = config["defaults"]["temperature"]["anyOf"][0]
    assert (temperature["minimum"], temperature["maximum"]) == (0, 2)
    assert config["priority"] == {"minimum": -100, "maximum": 100}
    assert "completed" in config["terminal"] and "in_progress" not in config["terminal"]


def test_the_console_pages_by_the_sizes_the_api_takes() -> None:
    """The console asks for no page larger than the list endpoints take (a 422 otherwise)."""
    pages = console_config()["pages"]
    assert pages["batches_max"] == BATCHES_PAGE_MAX
    assert pages["batches_default"] in pages["batches_sizes"]
    assert 1 <= pages["files"] <= FILES_PAGE_MAX
    assert 1 <= pages["error_lines"] <= ERROR_LINES_PAGE_MAX


class FakePartialOfLines:
    """Stands in for the partial-output service: the error stream is these lines, in chunks."""

    def __init__(self, lines: list[bytes]) -> None:
        self.data = b"\n".join(lines) + b"\n"

    async def open(self, project: str, batch_id: str, kind: str) -> Any:
        async def chunks() -> AsyncIterator[bytes]:
            for at in range(0, len(self.data), 7):  # lines split across chunks
                yield self.data[at : at + 7]

        return chunks()


def error_lines(count: int) -> list[bytes]:
    lines = []
    for i in range(count):
        doc = dict(NEVER_RAN if i % 3 == 0 else ENGINE_REFUSED, custom_id=f"id-{i}")
        lines.append(json.dumps(doc).encode())
    return lines


async def test_error_line_pages_follow_one_another_without_a_gap_or_a_repeat() -> None:
    service = ErrorLinesService(FakePartialOfLines(error_lines(10)))  # type: ignore[arg-type]
    first = await service.page("p", "b", offset=0, limit=4)
    assert [line.custom_id for line in first.data] == ["id-0", "id-1", "id-2", "id-3"]
    assert (first.has_more, first.next_offset) == (True, 4)
    rest = await service.page("p", "b", offset=4, limit=6)
    assert [line.custom_id for line in rest.data] == [f"id-{i}" for i in range(4, 10)]
    assert (rest.has_more, rest.next_offset) == (False, None)
    beyond = await service.page("p", "b", offset=50, limit=5)
    assert beyond.data == [] and not beyond.has_more


async def test_a_search_pages_through_its_matches_only() -> None:
    service = ErrorLinesService(FakePartialOfLines(error_lines(10)))  # type: ignore[arg-type]
    cancelled = await service.page("p", "b", offset=0, limit=2, code="batch_cancelled")
    assert [line.custom_id for line in cancelled.data] == ["id-0", "id-3"]
    assert cancelled.next_offset == 2
    more = await service.page("p", "b", offset=2, limit=2, code="batch_cancelled")
    assert [line.custom_id for line in more.data] == ["id-6", "id-9"] and not more.has_more
    one = await service.page("p", "b", offset=0, limit=5, custom_id="id-7")
    assert [line.line for line in one.data] == [8]


async def test_a_line_that_is_not_a_json_object_is_shown_not_a_failure() -> None:
    service = ErrorLinesService(FakePartialOfLines([b"[1, 2]", b"{broken", *error_lines(1)]))  # type: ignore[arg-type]
    page = await service.page("p", "b", offset=0, limit=5)
    assert [line.code for line in page.data] == ["unreadable_line", "unreadable_line", "batch_cancelled"]
