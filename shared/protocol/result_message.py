"""The result message: one finished line, and the result group that carries several.

A result is a version-1 ``ResultMessage``. On the results topic, a worker sends the results of
one batch that finish together as one version-2 message, a result group:
``{"schema_version": 2, "batch_id": ..., "results": [<version-1 result>, ...]}``, with the number
of results in its ``RESULT_COUNT_HEADER`` header (one Kafka message per line cost the worker's
producer and the aggregator's consumer more than the line itself). ``result_values`` gives a
message's results, whichever version it is. A reply topic gets version-1 messages only.

A result's response body is carried as raw JSON (``msgspec.Raw``): the engine serialises it
once, msgspec writes it into the message as it is and cuts it out again without parsing it, and
``output_line_json`` writes it into the output line. Nothing between the engine and the output
file parses it; its token usage travels beside it in ``ResultMessage.usage``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal, cast

import msgspec
import orjson

from shared.protocol.wire import ENCODER, RESULT_GROUP_VERSION, SCHEMA_VERSION

RESULT_COUNT_HEADER = "batchstream-results"
"""Kafka header of a result group: how many results it holds (ASCII digits), readable without
parsing the value. A message without it holds one result."""


class TokenUsage(msgspec.Struct, kw_only=True, frozen=True):
    """A line's token usage, in the endpoint's own terms, beside the raw body so that readers
    (the aggregator's batch usage, the worker's metrics) need not parse the body for it."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0

    @classmethod
    def from_body_usage(cls, usage: Any) -> TokenUsage | None:
        """From a body's ``usage`` object (chat, completions, responses, messages, embeddings,
        score, rerank); None if there is none."""
        if not isinstance(usage, dict):
            return None
        prompt = _int(usage.get("prompt_tokens", usage.get("input_tokens")))
        completion = _int(usage.get("completion_tokens", usage.get("output_tokens")))
        prompt_details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details")
        output_details = usage.get("completion_tokens_details") or usage.get("output_tokens_details")
        cached = _int(_get(prompt_details, "cached_tokens"))
        if "cache_read_input_tokens" in usage or "cache_creation_input_tokens" in usage:
            # A Messages body: its input_tokens leave out the prompt tokens read from or written
            # to the cache.
            cached = _int(usage.get("cache_read_input_tokens"))
            prompt += cached + _int(usage.get("cache_creation_input_tokens"))
        return cls(
            prompt_tokens=prompt,
            completion_tokens=completion,
            total_tokens=_int(usage.get("total_tokens")) or prompt + completion,
            cached_tokens=cached,
            reasoning_tokens=_int(_get(output_details, "reasoning_tokens")),
        )


def json_bytes(value: Any) -> bytes:
    """Raw JSON bytes as they are (kept on one line); any other value serialised."""
    if isinstance(value, bytes | bytearray | memoryview | msgspec.Raw):
        raw = bytes(value)
        # A record of the output file is one line: re-serialise the rare body that spans several.
        return orjson.dumps(orjson.loads(raw)) if b"\n" in raw or b"\r" in raw else raw
    return orjson.dumps(value)


def raw_json(value: Any) -> msgspec.Raw:
    """``value`` as raw JSON on one line (``json_bytes``), as a response body is carried."""
    return msgspec.Raw(json_bytes(value))


class ResponsePayload(msgspec.Struct, kw_only=True):
    """The endpoint's answer. Built from raw JSON bytes (or any JSON value, serialised once);
    ``body`` is then raw JSON on one line."""

    status_code: int
    request_id: str
    body: Annotated[msgspec.Raw, msgspec.Meta(description="The endpoint's response body (a JSON object).")]

    def __post_init__(self) -> None:
        if not isinstance(self.body, msgspec.Raw):  # built here, not read: as raw JSON once
            self.body = raw_json(self.body)


UNDELIVERABLE_CODE = "line_undeliverable"
"""A line the dispatcher could not send (its message over the broker's limit, or refused)."""

NotRunCode = Literal["batch_expired", "batch_cancelled"]
NOT_RUN_MESSAGES: dict[NotRunCode, str] = {
    "batch_expired": "This request was not run: the batch expired before it could be processed.",
    "batch_cancelled": "This request was not run: the batch was cancelled.",
}


class LineError(msgspec.Struct, kw_only=True):
    code: str
    message: str

    @classmethod
    def not_run(cls, code: NotRunCode) -> LineError:
        """The error of a line that never ran because its batch ended, whoever writes it (a
        worker that skips it, or the aggregator's fill at finalize): one wording per code."""
        return cls(code=code, message=NOT_RUN_MESSAGES[code])

    def as_dict(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message}


class ResultMessage(msgspec.Struct, kw_only=True):
    """One finished line, keyed by batch id on the results topic (or a pipeline's reply topic).

    ``usage`` was added within version 1: a message without it (an older worker's) gets it from
    its body when it is read.
    """

    schema_version: Literal[1] = SCHEMA_VERSION
    request_id: str
    custom_id: str
    batch_id: str | None = None
    line: int | None = None
    usage: Annotated[
        TokenUsage | None, msgspec.Meta(description="The body's token usage (set when the line succeeded).")
    ] = None
    response: ResponsePayload | None = None
    error: LineError | None = None

    def __post_init__(self) -> None:
        """An older message names no usage: read it from the body (the only time it is parsed)."""
        if self.usage is None and self.response is not None and self.response.status_code == 200:
            body = orjson.loads(memoryview(self.response.body))
            if isinstance(body, dict):
                self.usage = TokenUsage.from_body_usage(body.get("usage"))

    @property
    def succeeded(self) -> bool:
        return self.response is not None and self.response.status_code == 200

    def to_json(self) -> bytes:
        """The message as published: compact JSON, the body written unparsed."""
        return ENCODER.encode(self)

    @classmethod
    def from_json(cls, value: bytes) -> ResultMessage:
        """A published version-1 result, read without parsing its body: strictly (every result a
        worker writes), else with its scalar types coerced; a body over several lines is put on
        one. Raises ``msgspec.ValidationError``."""
        try:
            try:
                result = _READ.decode(value)
            except msgspec.ValidationError:
                result = _READ_LAX.decode(value)
        except msgspec.DecodeError as exc:  # not JSON: a validation error as any other
            raise msgspec.ValidationError(str(exc)) from exc
        response = result.response
        if response is not None and (b"\n" in value or b"\r" in value):
            response.body = raw_json(response.body)
        return result

    def output_line(self) -> dict[str, Any]:
        """The line as written to the batch's output or error file, parsed (tests, slow path)."""
        return orjson.loads(self.output_line_json())

    def output_line_json(self) -> bytes:
        """The line as written to the batch's output or error file: compact JSON, body unparsed."""
        return ENCODER.encode(OutputLine(self.request_id, self.custom_id, self.response, self.error))


class OutputLine(msgspec.Struct):
    """A line of a batch's output or error file (OpenAI's shape)."""

    id: str
    custom_id: str
    response: ResponsePayload | None
    error: LineError | None


class ResultGroup(msgspec.Struct, kw_only=True):
    """Several results of one batch in one results-topic message (the worker writes it with
    ``result_group_json`` and readers split it with ``result_values``)."""

    schema_version: Literal[2] = RESULT_GROUP_VERSION
    batch_id: str
    results: Annotated[list[ResultMessage], msgspec.Meta(description="Version-1 results of this batch.")]


_READ = msgspec.json.Decoder(ResultMessage)
_READ_LAX = msgspec.json.Decoder(ResultMessage, strict=False)
# A JSON object's members, each left as its raw JSON text.
_RAW_MEMBERS = msgspec.json.Decoder(dict[str, msgspec.Raw])
_RAW_LIST = msgspec.json.Decoder(list[msgspec.Raw])


def result_group_json(batch_id: str, results: Sequence[bytes]) -> bytes:
    """A version-2 message of one batch's results, each a ``ResultMessage.to_json()``, written
    in unparsed."""
    raws = cast(list[ResultMessage], [msgspec.Raw(result) for result in results])
    return ENCODER.encode(ResultGroup(batch_id=batch_id, results=raws))


def result_values(value: bytes) -> list[bytes]:
    """The version-1 results a results-topic message holds, each as its JSON bytes: the message
    itself unless it is a result group. Raises ``ValueError`` for a group that is not well formed
    (a version-1 message is judged when it is read, by ``ResultMessage.from_json``)."""
    if b'"results"' not in value:  # not a group: no need to parse it here
        return [value]
    try:
        members = _RAW_MEMBERS.decode(value)
    except msgspec.DecodeError:
        return [value]
    version = members.get("schema_version")
    if version is None or bytes(version) != b"2":
        return [value]
    results = members.get("results")
    try:
        return [bytes(raw) for raw in _RAW_LIST.decode(results if results is not None else b"")]
    except msgspec.DecodeError as exc:
        raise ValueError(f"a result group's results are not a JSON array: {exc}") from exc


def result_count(headers: Any) -> int:
    """How many results a results-topic message holds, from its headers (aiokafka's sequence of
    pairs, or a mapping): its ``RESULT_COUNT_HEADER``, else 1."""
    pairs = headers.items() if isinstance(headers, Mapping) else headers or ()
    for name, raw in pairs:
        if name == RESULT_COUNT_HEADER:
            try:
                return max(1, int(raw))
            except (TypeError, ValueError):
                return 1
    return 1


def _get(mapping: Any, key: str) -> Any:
    return mapping.get(key) if isinstance(mapping, dict) else None


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0
