"""ResultMessage carries the response body as raw JSON: spliced in, cut out, never re-parsed."""

from __future__ import annotations

import json

import msgspec
import orjson
import pytest
from msgspec import ValidationError

from shared.kafka import encode
from shared.protocol.messages import (
    RESULT_COUNT_HEADER,
    LineError,
    ResponsePayload,
    ResultMessage,
    TokenUsage,
    raw_json,
    result_count,
    result_group_json,
    result_values,
)
from shared.result_chunks import token_sums

LAX = msgspec.json.Decoder(ResultMessage, strict=False)
"""A result read with its scalar types coerced, its body as it came."""


def reference(value: bytes) -> ResultMessage:
    """The result ``value`` holds, read the slow way: coerced, its body rewritten on one line."""
    message = LAX.decode(value)
    if message.response is not None:
        message.response.body = raw_json(orjson.loads(bytes(message.response.body)))
    return message


# Key order, spacing and float spelling of its own: only a splice keeps them byte for byte.
BODY = (
    b'{"object":"chat.completion","choices":[{"message":{"content":"caf\xc3\xa9 \\n"}}],"x":1.50,'
    b'"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}'
)
USAGE = TokenUsage(prompt_tokens=3, completion_tokens=2, total_tokens=5)


def result(**kw: object) -> ResultMessage:
    fields: dict[str, object] = {
        "request_id": "batch_req_1",
        "custom_id": "c1",
        "batch_id": "batch_1",
        "line": 4,
        "usage": USAGE,
        "response": ResponsePayload(status_code=200, request_id="req_1", body=BODY),
    }
    return ResultMessage(**{**fields, **kw})  # type: ignore[arg-type]


def test_the_body_travels_byte_for_byte_from_the_engine_to_the_output_line() -> None:
    wire = result().to_json()
    assert BODY in wire
    back = ResultMessage.from_json(wire)
    assert back.response is not None and bytes(back.response.body) == BODY
    assert back.usage == USAGE and (back.batch_id, back.line) == ("batch_1", 4)
    line = back.output_line_json()
    assert BODY in line and b"\n" not in line
    assert json.loads(line) == {
        "id": "batch_req_1",
        "custom_id": "c1",
        "response": {"status_code": 200, "request_id": "req_1", "body": json.loads(BODY)},
        "error": None,
    }


def test_the_wire_shape_is_version_1_plus_usage() -> None:
    """Readers of version 1 (pipelines, an older aggregator) see the same nested object."""
    wire = orjson.loads(result().to_json())
    assert wire["schema_version"] == 1 and wire["response"]["body"] == json.loads(BODY)
    assert wire["usage"]["total_tokens"] == 5
    assert wire == json.loads(encode(result()))  # as any service writes a message


def test_an_older_message_without_usage_gets_it_from_its_body() -> None:
    old = {
        "schema_version": 1,
        "request_id": "r",
        "custom_id": "c",
        "batch_id": "b",
        "line": 1,
        "response": {"status_code": 200, "request_id": "q", "body": json.loads(BODY)},
        "error": None,
    }
    for read in (ResultMessage.from_json, LAX.decode):
        message = read(json.dumps(old).encode())
        assert message.usage == USAGE and message.succeeded
        assert message.response is not None and orjson.loads(bytes(message.response.body)) == json.loads(BODY)


def test_never_ran_and_error_lines() -> None:
    never = result(usage=None, response=None, error=LineError(code="batch_cancelled", message="no"))
    back = ResultMessage.from_json(never.to_json())
    assert back.response is None and back.error == never.error and back.usage is None
    rejected = result(
        usage=None, response=ResponsePayload(status_code=400, request_id="q", body={"error": {}})
    )
    back = ResultMessage.from_json(rejected.to_json())
    assert back.response is not None and bytes(back.response.body) == b'{"error":{}}' and not back.succeeded


def test_a_body_on_several_lines_is_put_on_one() -> None:
    payload = ResponsePayload(status_code=200, request_id="q", body=b'{\n  "a": 1\n}')
    assert bytes(payload.body) == b'{"a":1}'


@pytest.mark.parametrize(
    "value",
    [
        b"not json",
        b"[1, 2]",
        b'{"custom_id": "c"}',
        b'{"request_id":"r","custom_id":"c","response":{"status_code":200}}',
    ],
)
def test_what_is_not_a_result_raises_a_validation_error(value: bytes) -> None:
    with pytest.raises(ValidationError):
        ResultMessage.from_json(value)


def test_a_result_group_gives_back_its_results_and_others_themselves() -> None:
    one = ResultMessage(
        request_id="r1", custom_id="a", batch_id="b", line=1, error=LineError(code="x", message="y")
    )
    rerank = ResultMessage(
        request_id="r2",
        custom_id="b",
        batch_id="b",
        line=2,
        response=ResponsePayload(status_code=200, request_id="r2", body=b'{"results": [{"index": 0}]}'),
    )
    group = result_group_json("b", [one.to_json(), rerank.to_json()])
    assert [ResultMessage.from_json(v) for v in result_values(group)] == [one, rerank]
    # A version-1 message is itself, even when its body holds a "results" member.
    assert result_values(rerank.to_json()) == [rerank.to_json()]
    with pytest.raises(ValueError, match="not a JSON array"):
        result_values(b'{"schema_version": 2, "batch_id": "b", "results": {"no": 1}}')
    assert result_count([(RESULT_COUNT_HEADER, b"12")]) == 12
    assert result_count({RESULT_COUNT_HEADER: b"junk"}) == 1 and result_count(None) == 1


@pytest.mark.parametrize(
    "value",
    [
        b'{"schema_version":1,"request_id":"r","custom_id":"c","batch_id":"b","line":3,'
        b'"usage":{"prompt_tokens":2,"completion_tokens":1,"total_tokens":3},'
        b'"response":{"status_code":200,"request_id":"q","body":{"usage":{"prompt_tokens":2}}},"error":null}',
        b'{"request_id":"r","custom_id":"c","error":{"code":"batch_expired","message":"m"},"extra":1}',
        b'{"request_id":"r","custom_id":"c","response":{"status_code":500,"request_id":"q","body":{"error":{}}}}',
        # Taken only by the slow path: a line number as a string, a body on two lines, no usage.
        b'{"request_id":"r","custom_id":"c","line":"7"}',
        b'{"request_id":"r","custom_id":"c","response":{"status_code":200,"request_id":"q","body":{\n"a":1}}}',
        b'{"request_id":"r","custom_id":"c","response":{"status_code":200,"request_id":"q",'
        b'"body":{"usage":{"prompt_tokens":4,"completion_tokens":2}}}}',
    ],
)
def test_the_aggregator_s_read_gives_what_the_message_holds(value: bytes) -> None:
    fast, model = ResultMessage.from_json(value), reference(value)
    assert fast.output_line_json() == model.output_line_json()
    assert (fast.batch_id, fast.line, fast.succeeded) == (model.batch_id, model.line, model.succeeded)
    assert token_sums(fast.usage) == token_sums(model.usage)


def test_the_aggregator_s_read_takes_a_worker_s_result_strictly() -> None:
    message = ResultMessage(
        request_id="r",
        custom_id="c",
        batch_id="b",
        line=1,
        usage=TokenUsage(prompt_tokens=1, completion_tokens=2, total_tokens=3),
        response=ResponsePayload(status_code=200, request_id="q", body=b'{"x": "\\u00e9"}'),
    )
    assert isinstance(ResultMessage.from_json(message.to_json()), ResultMessage)
    with pytest.raises(ValidationError):
        ResultMessage.from_json(b'{"custom_id": "c"}')
