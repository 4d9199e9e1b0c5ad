"""The dispatcher's request messages (the body written unparsed) read as the message's."""

from __future__ import annotations

import json

import msgspec
import orjson
import pytest

from shared.protocol.batch_input import UTF8_BOM, BatchRequestInput, parse_raw_line
from shared.protocol.messages import (
    RequestMessage,
    SamplingDefaults,
    message_defaults,
    read_request,
)

LINES = [
    b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", '
    b'"body": {"model": "m", "messages": [{"role": "user", "content": "h\\u00e9\\nllo"}], "max_tokens": 3}}',
    UTF8_BOM
    + b'{"url": "/v1/embeddings", "custom_id": "b\\"q", "body": {"model": "m", "input": ["x"]}, "x": 1}',
    b'{"custom_id": "c", "url": "/v1/completions", "body":\n {"model": "m",\n "prompt": "p", "n": 2}}',
]


@pytest.mark.parametrize("raw", LINES)
@pytest.mark.parametrize(
    "defaults,expires_at",
    [(SamplingDefaults(), 1_900_000_000.5), (SamplingDefaults(temperature=0.5, top_k=-1), None)],
)
def test_a_spliced_request_message_equals_the_models(
    raw: bytes, defaults: SamplingDefaults, expires_at: float | None
) -> None:
    item, envelope = BatchRequestInput.parse(raw), parse_raw_line(raw)
    fields = {
        "request_id": "batch_req_1",
        "batch_id": "batch_1",
        "line": 7,
        "project": "proj-a",
        "expires_at": expires_at,
    }
    spliced = RequestMessage.batch_line(
        custom_id=envelope.custom_id,
        url=envelope.url,
        body=bytes(envelope.body),
        defaults=message_defaults(defaults),
        **fields,  # type: ignore[arg-type]
    )
    model = RequestMessage(
        custom_id=item.custom_id, url=item.url, body=item.body, defaults=message_defaults(defaults), **fields
    )

    assert RequestMessage.from_value(orjson.loads(spliced)) == model
    plain = read_request(spliced)  # the worker's hot path reads the same
    assert plain is not None
    names = (
        "request_id",
        "custom_id",
        "url",
        "body",
        "batch_id",
        "line",
        "project",
        "reply_topic",
        "expires_at",
    )
    for name in names:
        assert getattr(plain, name) == getattr(model, name), name
    assert plain.defaults is not None
    assert msgspec.structs.asdict(plain.defaults) == defaults.model_dump()
    assert orjson.loads(model.to_json()) == orjson.loads(spliced)


def test_the_body_reaches_the_message_exactly_as_written() -> None:
    """Nothing is re-read: an integer over 64 bits stays that integer (a float before)."""
    raw = b'{"custom_id": "c", "url": "/v1/completions", "body": {"seed": 123456789012345678901234}}'
    envelope = parse_raw_line(raw)
    spliced = RequestMessage.batch_line(
        request_id="r",
        custom_id=envelope.custom_id,
        url=envelope.url,
        body=bytes(envelope.body),
        batch_id="b",
        line=1,
        project="p",
        defaults=None,
        expires_at=None,
    )
    assert json.loads(spliced)["body"] == json.loads(raw)["body"]


@pytest.mark.parametrize(
    "value",
    [
        b'{"request_id": "r", "custom_id": "c", "url": "/v1/completions", "body": {}, "line": "7"}',
        b'{"request_id": "r", "custom_id": "c", "url": "/v1/completions", "body": {},'
        b' "defaults": {"temperature": 9}}',
        b'{"request_id": "r", "custom_id": "c", "url": "/v1/completions", "body": []}',
        b'{"request_id": "r", "url": "/v1/completions", "body": {}}',
        b"[1]",
    ],
)
def test_what_the_hot_path_does_not_take_as_it_is_goes_to_the_lax_read(value: bytes) -> None:
    """A type to coerce, a default out of range, a wrong or missing field: the worker reads it
    the slow way, which coerces or words the error."""
    assert read_request(value) is None
