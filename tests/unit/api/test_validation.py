"""The input validator reports every bad line with OpenAI's codes, and passes good files."""

from __future__ import annotations

import asyncio
import io
import json
import time
from typing import Any

import pytest
from pydantic_core import to_json

from services.api.dispatch.order import read_entries
from services.api.service.dispatch_order import OrderBuilder
from services.api.service.validation import CustomIdCheck, InputValidator, ValidationReport, listed
from shared.errors import ECHO_CHARS
from shared.protocol.openai import BatchError
from tests.support.lines import file_request_lines, served

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


async def validate(items: list[bytes], max_lines: int = 100, max_errors: int = 100) -> ValidationReport:
    validator = InputValidator(ENDPOINT, served(m=1024, other=None), max_lines, max_errors)
    return await validator.run(file_request_lines(items))


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
    assert report.errors[0].message == "The input file has 4 lines; the limit is 3."


async def test_reported_errors_are_capped_but_all_are_counted() -> None:
    report = await validate([b"x"] * 10, max_errors=3)
    assert len(report.errors) == 3
    assert report.error_count == 10


RESPONSES = "/v1/responses"


def response_line(custom_id: str, **body: Any) -> bytes:
    item = {"custom_id": custom_id, "method": "POST", "url": RESPONSES, "body": {"model": "m", **body}}
    return json.dumps(item).encode()


async def validate_responses(items: list[bytes]) -> ValidationReport:
    return await InputValidator(RESPONSES, served(m=1024), 100, 100).run(file_request_lines(items))


async def test_a_good_responses_file_passes() -> None:
    report = await validate_responses(
        [
            response_line("text", input="Say hi", instructions="Be brief.", max_output_tokens=16),
            response_line("items", input=[{"role": "user", "content": "hi"}], temperature=0.2),
            response_line("stored", input="hi", store=True, background=False),
        ]
    )
    assert report.ok, report.errors
    assert report.lines == 3 and report.model == "m"


async def test_bad_responses_lines_are_reported_like_the_other_endpoints() -> None:
    report = await validate_responses(
        [
            response_line("a", messages=MESSAGES),
            response_line("b", input=""),
            response_line("c", input="hi", stream=True),
            response_line("d", input="hi", max_output_tokens=0),
            response_line("e", input="hi", max_output_tokens=5000),
            response_line("f", input="hi", background=True),
            response_line("g", input="hi", previous_response_id="resp_1"),
            line("h"),  # a chat line in a Responses batch
        ]
    )
    assert codes(report) == [
        (1, "invalid_request", "body.input"),
        (2, "invalid_request", "body.input"),
        (3, "streaming_unsupported", "body.stream"),
        (4, "invalid_request", "body.max_output_tokens"),
        (5, "token_limit_exceeded", "body.max_output_tokens"),
        (6, "invalid_request", "body.background"),
        (7, "invalid_request", "body.previous_response_id"),
        (8, "invalid_url", "url"),
        (8, "invalid_request", "body.input"),
    ]
    assert "not supported in a batch" in report.errors[5].message


async def test_repeated_custom_ids_are_reported_at_each_repeat_in_line_order() -> None:
    report = await validate([line("x"), b"{bad", line("y"), line("x"), line("z"), line("y"), line("x")])
    assert codes(report) == [
        (2, "invalid_json_line", None),
        (4, "duplicate_custom_id", "custom_id"),
        (6, "duplicate_custom_id", "custom_id"),
        (7, "duplicate_custom_id", "custom_id"),
    ]
    assert report.errors[1].message == "custom_id 'x' is not unique."
    assert report.error_count == 4


async def test_repeats_spilled_across_runs_are_all_counted_and_the_first_ones_reported() -> None:
    validator = InputValidator(ENDPOINT, served(m=1024), 10_000, max_reported_errors=5)
    validator._custom_ids = CustomIdCheck(run_bytes=4096)  # a few dozen records per run: many runs
    items = [line(f"id-{i % 700}") for i in range(2000)]
    report = await validator.run(file_request_lines(items))
    assert report.error_count == 2000 - 700
    assert [e.line for e in report.errors] == [701, 702, 703, 704, None]  # the last says how many
    assert {e.code for e in report.errors[:-1]} == {"duplicate_custom_id"}
    assert report.errors[-1].code == "errors_truncated"
    assert report.errors[-1].message == "The input file has 1300 errors in all; the first 4 are listed."


async def test_a_file_past_the_largest_line_number_fails_however_few_requests_it_has(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("services.api.service.validation.MAX_LINE_NUMBER", 5)
    report = await validate([line("a"), b"", b"", b"", b"", line("b")])  # "b" is line 6
    assert codes(report) == [(None, "too_many_tasks", None)]
    assert report.errors[0].message == "The input file has more than 5 lines."


async def test_repeats_are_counted_even_when_no_error_is_reported() -> None:
    validator = InputValidator(ENDPOINT, served(m=1024), 100, max_reported_errors=0)
    report = await validator.run(file_request_lines([line("x"), line("x")]))
    assert not report.ok and report.error_count == 1 and report.errors == []


def nested(depth: int) -> Any:
    value: Any = "deep"
    for _ in range(depth):
        value = [value]
    return value


async def test_a_line_nested_deeper_than_a_request_message_can_carry_fails() -> None:
    # The line's object and its body are two levels: 254 in all is the deepest orjson writes.
    deep = {"model": "m", "messages": MESSAGES, "metadata": nested(253)}  # orjson reads it, cannot write it
    shallow = {"model": "m", "messages": MESSAGES, "metadata": nested(252)}
    many_brackets = {"model": "m", "messages": [{"role": "user", "content": "[{" * 400}]}  # in a string
    report = await validate([line("a", body=deep), line("b", body=shallow), line("c", body=many_brackets)])
    assert codes(report) == [(1, "invalid_request", "body")]
    assert report.errors[0].message == "This line is nested too deeply to be sent on."


LONG = 15_000  # characters of a client's value a line echoes (a model name, a custom_id)


async def test_lines_echoing_long_strings_make_a_small_errors_list() -> None:
    """1,000 lines naming a 15 KB model, half of them repeating a 15 KB custom_id: every message
    quotes the values cut short, and the list stays within its byte cap, its last entry saying
    how many errors there were in all."""
    long_id, long_model = "c" * LONG, "m" * LONG
    items = [
        line(long_id if i % 2 else f"id-{i}", url="u" * LONG, body={"model": long_model}) for i in range(1000)
    ]
    validator = InputValidator(ENDPOINT, served(m=1024), 1000, 1000, max_reported_error_bytes=64 * 1024)
    report = await validator.run(file_request_lines(items))
    assert report.error_count > 1000
    assert len(to_json(report.errors)) <= 64 * 1024
    assert all(len(e.message) < 3 * ECHO_CHARS for e in report.errors)
    assert {e.code for e in report.errors[:-1]} >= {"invalid_url", "model_not_found", "duplicate_custom_id"}
    shown = len(report.errors) - 1
    note = f"The input file has {report.error_count} errors in all; the first {shown} are listed."
    assert (report.errors[-1].code, report.errors[-1].message) == ("errors_truncated", note)
    assert f"… ({LONG} characters)" in report.errors[0].message


def errors(count: int, message: str = "bad") -> list[BatchError]:
    return [
        BatchError(code="invalid_request", message=message, param="body", line=n) for n in range(1, count + 1)
    ]


def test_errors_that_fit_are_listed_as_they_are() -> None:
    assert listed(errors(3), 3, 10, 10_000) == errors(3)


def test_errors_over_the_entry_cap_end_with_a_note_within_the_cap() -> None:
    kept = listed(errors(10), 1500, 5, 10_000)
    assert [e.line for e in kept] == [1, 2, 3, 4, None]
    assert kept[-1].message == "The input file has 1500 errors in all; the first 4 are listed."


def test_errors_over_the_byte_cap_keep_the_first_that_fit_with_the_note() -> None:
    many = errors(100, "x" * 200)
    kept = listed(many, 100, 1000, 4096)
    assert 1 < len(kept) < 100 and kept[:-1] == many[: len(kept) - 1]
    assert len(to_json(kept)) <= 4096
    assert kept[-1].code == "errors_truncated" and kept[-1].line is None


def test_errors_left_out_before_the_cap_are_still_announced() -> None:
    """The validator keeps the first ``max_reported_errors``; the count says more were found."""
    kept = listed(errors(3), 7, 10, 10_000)
    assert [e.line for e in kept] == [1, 2, 3, None]
    assert "7 errors in all" in kept[-1].message


def test_no_entry_is_listed_when_none_may_be() -> None:
    assert listed(errors(3), 3, 0, 10_000) == []


async def test_a_media_url_the_workers_may_not_fetch_is_that_lines_error() -> None:
    def with_image(url: str) -> dict[str, Any]:
        content = [{"type": "text", "text": "?"}, {"type": "image_url", "image_url": {"url": url}}]
        return {"model": "m", "messages": [{"role": "user", "content": content}]}

    items = [
        line("inline", body=with_image("data:image/png;base64,AAAA")),
        line("metadata", body=with_image("http://169.254.169.254/latest/meta-data/")),
        line("allowed", body=with_image("https://images.example.com/a.png")),
    ]
    items.append(  # the key spelt with a JSON escape: found all the same
        line("escaped", body=with_image("http://10.0.0.1/a.png")).replace(
            b'"image_url": {', b'"image\\u005furl": {'
        )
    )
    param = "body.messages[0].content[1].image_url.url"
    report = await validate(items)
    assert codes(report) == [
        (2, "invalid_request", param),
        (3, "invalid_request", param),
        (4, "invalid_request", param),
    ]
    validator = InputValidator(
        ENDPOINT, served(m=1024), 100, 100, allowed_media_domains=frozenset({"images.example.com"})
    )
    assert codes(await validator.run(file_request_lines(items))) == [
        (2, "invalid_request", param),
        (4, "invalid_request", param),
    ]


async def test_a_line_over_the_byte_limit_is_its_own_error_naming_its_size_and_the_limit() -> None:
    limit = len(line("a")) + 10
    big = line("b" + "x" * 11)
    exact = line("c" + "y" * 10)
    assert (len(big), len(exact)) == (limit + 1, limit)
    validator = InputValidator(ENDPOINT, served(m=1024), 100, 100, max_line_bytes=limit)
    report = await validator.run(file_request_lines([line("a"), big, exact], max_line_bytes=limit))
    assert codes(report) == [(2, "line_too_large", None)]
    assert report.errors[0].message == f"This line is {limit + 1} bytes; the limit is {limit} bytes per line."
    assert report.lines == 3


async def test_the_event_loop_keeps_answering_while_a_large_file_validates() -> None:
    items = [line(f"id-{n}", body={"model": "m", "messages": MESSAGES * 20}) for n in range(10_000)]
    gaps: list[float] = []

    async def tick() -> None:
        loop = asyncio.get_running_loop()
        while True:
            before = loop.time()
            await asyncio.sleep(0.005)
            gaps.append(loop.time() - before)

    ticker = asyncio.create_task(tick())
    started = time.monotonic()
    try:
        report = await validate(items, max_lines=100_000)
    finally:
        ticker.cancel()
    took = time.monotonic() - started
    assert report.ok and report.lines == 10_000
    assert max(gaps) < max(0.2, took / 5), f"the loop stalled {max(gaps):.2f} s of {took:.2f} s"


async def test_validation_feeds_the_order_each_line_s_expected_length() -> None:
    """Lines go longest first by their own cap, else the batch's ``max_decoding_length``."""
    caps: list[int | None] = [8, None, 300, 8, None]
    items = []
    for n, cap in enumerate(caps, 1):
        body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": f"q{n}"}]}
        if cap is not None:
            body["max_tokens"] = cap
        items.append(line(f"r{n}", body=body))
    order = OrderBuilder(min_shared_chars=256, longest_first=True)
    validator = InputValidator(ENDPOINT, served(m=1024), 100, 100, order=order, default_length=64)
    assert (await validator.run(file_request_lines(items))).ok
    assert order.plan().worth_storing
    source = io.BytesIO(b"\n".join(items) + b"\n")
    out = io.BytesIO()
    order.write(out, source)
    order.close()
    entries, _ = read_entries(out.getvalue())
    assert [e.number for e in entries] == [3, 2, 5, 1, 4]  # 300, then the default's 64s, then 8s


async def test_validation_sums_the_lines_expected_output_tokens() -> None:
    """The batch's expected work (its estimated completion's basis): each line's cap, else the
    batch's ``max_decoding_length``; unknown once a line has neither."""

    def lines(*caps: int | None) -> list[bytes]:
        bodies = [
            {"model": "m", "messages": [{"role": "user", "content": "q"}], **({"max_tokens": c} if c else {})}
            for c in caps
        ]
        return [line(f"r{n}", body=body) for n, body in enumerate(bodies, 1)]

    with_default = InputValidator(ENDPOINT, served(m=1024), 100, 100, default_length=64)
    report = await with_default.run(file_request_lines(lines(8, None, 300)))
    assert report.ok and report.expected_tokens == 8 + 64 + 300
    without = InputValidator(ENDPOINT, served(m=1024), 100, 100)
    report = await without.run(file_request_lines(lines(8, None, 300)))
    assert report.ok and report.expected_tokens is None
