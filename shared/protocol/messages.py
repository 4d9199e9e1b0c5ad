"""Versioned Kafka messages: the public request schema and the internal result/control facts.

A message is one JSON object with ``schema_version``. Consumers accept the versions they know and
reject others with a clear error; fields are only ever added within a version.

A result is a version-1 ``ResultMessage``. On the results topic, a worker sends the results of
one batch that finish together as one version-2 message, a result group:
``{"schema_version": 2, "batch_id": ..., "results": [<version-1 result>, ...]}``, with the number
of results in its ``RESULT_COUNT_HEADER`` header (one Kafka message per line cost the worker's
producer and the aggregator's consumer more than the line itself). ``result_values`` gives a
message's results, whichever version it is. A reply topic gets version-1 messages only.

A result's response body is carried as raw JSON bytes (``RawJson``): the engine serialises it
once, ``ResultMessage.to_json`` splices it into the message, ``ResultMessage.from_json`` cuts it
out again without parsing it (msgspec's ``Raw``), and ``output_line_json`` splices it into the
output line. Nothing between the engine and the output file parses it; its token usage travels
beside it in ``ResultMessage.usage``.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal, Protocol

import msgspec
import orjson
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)

SCHEMA_VERSION: Literal[1] = 1
RESULT_GROUP_VERSION: Literal[2] = 2
"""A results-topic message of this version holds several version-1 results of one batch."""
RESULT_COUNT_HEADER = "batchstream-results"
"""Kafka header of a result group: how many results it holds (ASCII digits), readable without
parsing the value. A message without it holds one result."""


class SamplingDefaults(BaseModel):
    """Batch-level defaults; a field set in a request body wins over these.

    The one definition of these five fields: the create parameters, the Batch object and the
    request message all use it, so their types and ranges are checked once (a 400 at create).
    """

    max_decoding_length: int | None = Field(default=None, ge=1, strict=True)
    max_context_length: int | None = Field(default=None, ge=1, strict=True)
    temperature: float | None = Field(default=None, ge=0, le=2, strict=True)
    top_p: float | None = Field(default=None, gt=0, le=1, strict=True)
    top_k: int | None = Field(default=None, strict=True, description="-1 (no limit) or >= 1.")

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, value: int | None) -> int | None:
        if value is not None and value != -1 and value < 1:
            raise ValueError("top_k must be -1 (no limit) or at least 1")
        return value


class RequestMessage(BaseModel):
    """One request line, published to ``requests.<model>``.

    Pipelines may publish these directly: leave ``batch_id`` null and name a ``reply_topic``.
    """

    model_config = ConfigDict(extra="ignore")
    schema_version: Literal[1] = SCHEMA_VERSION
    request_id: str = Field(description="Unique per line; becomes the output line's id.")
    custom_id: str
    method: Literal["POST"] = "POST"
    url: str
    body: dict[str, Any]
    batch_id: str | None = Field(
        default=None, description="Set by the api only (its messages are signed); leave null."
    )
    line: int | None = Field(default=None, description="1-based line in the input file.")
    project: str | None = Field(
        default=None,
        description="Set by the api only, on batch lines: the batch's project (the worker shares "
        "its engine between projects); ignored on a direct request.",
    )
    reply_topic: str | None = Field(
        default=None,
        description="Where the result goes; required unless the api sent the message (its batch "
        "lines go to the results topic).",
    )
    defaults: SamplingDefaults | None = None
    expires_at: float | None = Field(default=None, description="Unix seconds; not run after.")


class WireDefaults(msgspec.Struct):
    """``SamplingDefaults`` as ``read_plain_request`` gives them (their ranges checked by it)."""

    max_decoding_length: int | None = None
    max_context_length: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None


@functools.lru_cache(maxsize=256)
def _checked_defaults(values: tuple[Any, ...]) -> SamplingDefaults:
    """A batch's defaults, checked once (every line of a batch carries the same)."""
    return SamplingDefaults.model_validate(dict(zip(_DEFAULT_FIELDS, values, strict=True)))


_DEFAULT_FIELDS = tuple(WireDefaults.__struct_fields__)


class WireRequest(msgspec.Struct):
    """A ``RequestMessage`` whose every field is already of its type, read by msgspec: the
    worker's hot path (``read_plain_request``), built without pydantic, whose
    ``model_construct`` alone cost more than the read."""

    request_id: str
    custom_id: str
    url: str
    body: dict[str, Any]
    schema_version: Literal[1] = SCHEMA_VERSION
    method: Literal["POST"] = "POST"
    batch_id: str | None = None
    line: int | None = None
    project: str | None = None
    reply_topic: str | None = None
    defaults: WireDefaults | None = None
    expires_at: float | None = None


_WIRE_REQUEST = msgspec.json.Decoder(WireRequest)


class DefaultsLike(Protocol):
    """A batch's sampling defaults as the worker reads them: ``SamplingDefaults`` or
    ``WireDefaults``."""

    @property
    def max_decoding_length(self) -> int | None: ...
    @property
    def max_context_length(self) -> int | None: ...
    @property
    def temperature(self) -> float | None: ...
    @property
    def top_p(self) -> float | None: ...
    @property
    def top_k(self) -> int | None: ...


class RequestLike(Protocol):
    """A request message as the worker reads it: ``RequestMessage`` or ``WireRequest``."""

    @property
    def request_id(self) -> str: ...
    @property
    def custom_id(self) -> str: ...
    @property
    def url(self) -> str: ...
    @property
    def body(self) -> dict[str, Any]: ...
    @property
    def batch_id(self) -> str | None: ...
    @property
    def line(self) -> int | None: ...
    @property
    def project(self) -> str | None: ...
    @property
    def reply_topic(self) -> str | None: ...
    @property
    def defaults(self) -> DefaultsLike | None: ...
    @property
    def expires_at(self) -> float | None: ...


def read_plain_request(value: bytes) -> WireRequest | None:
    """The request message ``value`` holds when msgspec takes it as it is (every line the api
    sends), its defaults' ranges checked by ``SamplingDefaults`` (once per batch); None for
    anything else, which the caller reads and judges with pydantic (a type to coerce, a default
    out of range, an invalid message to word)."""
    try:
        wire = _WIRE_REQUEST.decode(value)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    if wire.defaults is not None:
        try:
            _checked_defaults(msgspec.structs.astuple(wire.defaults))
        except ValidationError:
            return None
    return wire


def request_message_json(
    *,
    request_id: str,
    custom_id: str,
    url: str,
    body: bytes,
    batch_id: str,
    line: int,
    project: str,
    defaults: dict[str, Any] | None,
    expires_at: float | None,
) -> bytes:
    """A batch line's ``RequestMessage`` JSON with its ``body`` (a JSON object's raw bytes, as the
    input line holds it) spliced in unparsed: the dispatcher's hot path. It reads as the same
    message ``RequestMessage(...).model_dump_json()`` writes (tests/unit/protocol)."""
    head = orjson.dumps(
        {
            "schema_version": SCHEMA_VERSION,
            "request_id": request_id,
            "custom_id": custom_id,
            "method": "POST",
            "url": url,
            "batch_id": batch_id,
            "line": line,
            "project": project,
            "reply_topic": None,
            "defaults": defaults,
            "expires_at": expires_at,
        }
    )
    return b"".join((head[:-1], b',"body":', body, b"}"))


def _json_bytes(value: Any) -> bytes:
    """Raw JSON bytes as they are (kept on one line); any other value serialised."""
    if isinstance(value, bytes | bytearray | memoryview | msgspec.Raw):
        raw = bytes(value)
        # A record of the output file is one line: re-serialise the rare body that spans several.
        return orjson.dumps(orjson.loads(raw)) if b"\n" in raw or b"\r" in raw else raw
    return orjson.dumps(value)


RawJson = Annotated[
    bytes,
    BeforeValidator(_json_bytes),
    PlainSerializer(orjson.loads, return_type=Any),
    WithJsonSchema({"description": "Any JSON value, carried as raw JSON."}),
]
"""A JSON value held as its serialised bytes. Validated from any JSON value or from raw bytes;
``model_dump`` gives it back parsed (slow path); the ``to_json`` methods splice it unparsed."""


class TokenUsage(BaseModel):
    """A line's token usage, in the endpoint's own terms, beside the raw body so that readers
    (the aggregator's batch usage, the worker's metrics) need not parse the body for it."""

    model_config = ConfigDict(frozen=True)
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


class ResponsePayload(BaseModel):
    status_code: int
    request_id: str
    body: RawJson = Field(description="The endpoint's response body (a JSON object).")

    def wire(self) -> dict[str, Any]:
        """For ``orjson.dumps``: the body spliced in as it is."""
        return {
            "status_code": self.status_code,
            "request_id": self.request_id,
            "body": orjson.Fragment(self.body),
        }


class LineError(BaseModel):
    code: str
    message: str

    @classmethod
    def not_run(cls, code: NotRunCode) -> LineError:
        """The error of a line that never ran because its batch ended, whoever writes it (a
        worker that skips it, or the aggregator's fill at finalize): one wording per code."""
        return cls(code=code, message=NOT_RUN_MESSAGES[code])


NotRunCode = Literal["batch_expired", "batch_cancelled"]
NOT_RUN_MESSAGES: dict[NotRunCode, str] = {
    "batch_expired": "This request was not run: the batch expired before it could be processed.",
    "batch_cancelled": "This request was not run: the batch was cancelled.",
}


class ResultMessage(BaseModel):
    """One finished line, keyed by batch id on the results topic (or a pipeline's reply topic).

    ``usage`` was added within version 1: a message without it (an older worker's) gets it from
    its body when it is read.
    """

    model_config = ConfigDict(extra="ignore")
    schema_version: Literal[1] = SCHEMA_VERSION
    request_id: str
    custom_id: str
    batch_id: str | None = None
    line: int | None = None
    usage: TokenUsage | None = Field(
        default=None, description="The body's token usage (set when the line succeeded)."
    )
    response: ResponsePayload | None = None
    error: LineError | None = None

    @model_validator(mode="after")
    def _usage_from_body(self) -> ResultMessage:
        """An older message names no usage: read it from the body (the only time it is parsed)."""
        if self.usage is None and self.response is not None and self.succeeded:
            body = orjson.loads(self.response.body)
            if isinstance(body, dict):
                self.usage = TokenUsage.from_body_usage(body.get("usage"))
        return self

    @property
    def succeeded(self) -> bool:
        return self.response is not None and self.response.status_code == 200

    def to_json(self) -> bytes:
        """The message as published: compact JSON, the body spliced in unparsed."""
        return orjson.dumps(
            {
                "schema_version": self.schema_version,
                "request_id": self.request_id,
                "custom_id": self.custom_id,
                "batch_id": self.batch_id,
                "line": self.line,
                "usage": self.usage.model_dump() if self.usage else None,
                "response": self.response.wire() if self.response else None,
                "error": self.error.model_dump() if self.error else None,
            }
        )

    @classmethod
    def from_json(cls, value: bytes) -> ResultMessage:
        """A published message, read without parsing its body; raises pydantic's ``ValidationError``.
        (The aggregator's hot path is ``read_result``.)"""
        try:
            members = _RAW_OBJECT.decode(value)
        except msgspec.DecodeError:  # not a JSON object: pydantic words the error
            return cls.model_validate_json(value)
        response = members.pop("response", None)
        data: dict[str, Any] = {key: orjson.loads(memoryview(raw)) for key, raw in members.items()}
        if response is not None:
            data["response"] = _response_members(response)
        return cls.model_validate(data)

    def output_line(self) -> dict[str, Any]:
        """The line as written to the batch's output or error file, parsed (tests, slow path)."""
        return orjson.loads(self.output_line_json())

    def output_line_json(self) -> bytes:
        """The line as written to the batch's output or error file: compact JSON, body unparsed."""
        return orjson.dumps(
            {
                "id": self.request_id,
                "custom_id": self.custom_id,
                "response": self.response.wire() if self.response else None,
                "error": self.error.model_dump() if self.error else None,
            }
        )


class ResultGroup(BaseModel):
    """Several results of one batch in one results-topic message (the schema of the docs; the
    worker writes it with ``result_group_json`` and readers split it with ``result_values``)."""

    schema_version: Literal[2] = RESULT_GROUP_VERSION
    batch_id: str
    results: list[ResultMessage] = Field(description="Version-1 results of this batch.")


# A JSON object's members, each left as its raw JSON text.
_RAW_OBJECT = msgspec.json.Decoder(dict[str, msgspec.Raw])


class WireUsage(msgspec.Struct):
    """``TokenUsage`` as ``read_result`` gives it."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0


class _WireResponse(msgspec.Struct):
    status_code: int
    request_id: str
    body: msgspec.Raw


class _WireError(msgspec.Struct):
    code: str
    message: str


class WireResult(msgspec.Struct):
    """A version-1 result as ``ResultMessage.to_json`` writes it, read by msgspec for the
    aggregator's hot path (``read_result``): the same fields and types, checked strictly,
    unknown fields ignored as the model does, built without pydantic (whose ``model_construct``
    alone cost the aggregator a fifth of its CPU)."""

    request_id: str
    custom_id: str
    schema_version: Literal[1] = SCHEMA_VERSION
    batch_id: str | None = None
    line: int | None = None
    usage: WireUsage | None = None
    response: _WireResponse | None = None
    error: _WireError | None = None

    @property
    def succeeded(self) -> bool:
        return self.response is not None and self.response.status_code == 200

    def output_line_json(self) -> bytes:
        """``ResultMessage.output_line_json`` of the same result, byte for byte."""
        response = self.response
        error = self.error
        return orjson.dumps(
            {
                "id": self.request_id,
                "custom_id": self.custom_id,
                "response": None
                if response is None
                else {
                    "status_code": response.status_code,
                    "request_id": response.request_id,
                    "body": orjson.Fragment(bytes(response.body)),
                },
                "error": None if error is None else {"code": error.code, "message": error.message},
            }
        )


_WIRE_RESULT = msgspec.json.Decoder(WireResult)


class UsageCounts(Protocol):
    """A line's token usage as the aggregator reads it: ``TokenUsage`` or ``WireUsage``."""

    @property
    def prompt_tokens(self) -> int: ...
    @property
    def completion_tokens(self) -> int: ...
    @property
    def total_tokens(self) -> int: ...
    @property
    def cached_tokens(self) -> int: ...
    @property
    def reasoning_tokens(self) -> int: ...


class CountedResult(Protocol):
    """What the aggregator reads of a result: ``ResultMessage`` or ``WireResult``."""

    @property
    def batch_id(self) -> str | None: ...
    @property
    def line(self) -> int | None: ...
    @property
    def usage(self) -> UsageCounts | None: ...
    @property
    def succeeded(self) -> bool: ...
    def output_line_json(self) -> bytes: ...


def read_result(value: bytes) -> CountedResult:
    """A version-1 result, read for counting and storing: a ``WireResult`` when msgspec takes it
    as it is (every result a worker writes); anything else (a type pydantic would coerce, an
    older message without ``usage``, a body over several lines) through
    ``ResultMessage.from_json``, which judges and words it (raises ``ValidationError``)."""
    try:
        wire = _WIRE_RESULT.decode(value)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return ResultMessage.from_json(value)
    # A raw line break in compact JSON can only be a body's own whitespace: an output line is
    # one line, so such a body is rewritten by the model's slow path.
    response = wire.response
    if response is not None and (
        (response.status_code == 200 and wire.usage is None) or b"\n" in value or b"\r" in value
    ):
        return ResultMessage.from_json(value)
    return wire


_RAW_LIST = msgspec.json.Decoder(list[msgspec.Raw])


def result_group_json(batch_id: str, results: Sequence[bytes]) -> bytes:
    """A version-2 message of one batch's results, each a ``ResultMessage.to_json()``, spliced
    in unparsed."""
    head = orjson.dumps({"schema_version": RESULT_GROUP_VERSION, "batch_id": batch_id})
    return b"".join((head[:-1], b',"results":[', b",".join(results), b"]}"))


def result_values(value: bytes) -> list[bytes]:
    """The version-1 results a results-topic message holds, each as its JSON bytes: the message
    itself unless it is a result group. Raises ``ValueError`` for a group that is not well formed
    (a version-1 message is judged when it is read, by ``ResultMessage.from_json``)."""
    if b'"results"' not in value:  # not a group: no need to parse it here
        return [value]
    try:
        members = _RAW_OBJECT.decode(value)
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


def _response_members(raw: msgspec.Raw) -> Any:
    """The response object with its body left raw (or whatever else it is, parsed)."""
    try:
        members = _RAW_OBJECT.decode(raw)
    except msgspec.ValidationError:  # not an object (null, or wrong): pydantic judges it
        return orjson.loads(memoryview(raw))
    body = members.pop("body", None)
    data: dict[str, Any] = {key: orjson.loads(memoryview(part)) for key, part in members.items()}
    if body is not None:
        data["body"] = body
    return data


def _get(mapping: Any, key: str) -> Any:
    return mapping.get(key) if isinstance(mapping, dict) else None


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


class ControlMessage(BaseModel):
    """Batch facts workers need without a database call, on the compacted control topic."""

    schema_version: Literal[1] = SCHEMA_VERSION
    batch_id: str
    model: str | None = None
    total: int | None = None
    expires_at: float | None = None
    cancelled: bool = False


DeadLetterReason = Literal[
    "invalid_message",
    "batch_not_verified",
    "reply_topic_missing",
    "reply_topic_invalid",
    "reply_topic_internal",
    "reply_undeliverable",
]
"""Why a worker dead-lettered a request message (also the label of its counter)."""
DEAD_LETTER_VALUE_BYTES = 4096
"""Most bytes of the original message a dead letter holds (``value``)."""
BATCH_NOT_VERIFIED_CODE = "batch_not_verified"
BATCH_NOT_VERIFIED_MESSAGE = (
    "This request was not run: only the api may name a batch_id (its messages are signed); "
    "leave batch_id and line null."
)

RESULT_TOO_LARGE_CODE = "result_too_large"
RESULT_TOO_LARGE_MESSAGE = "This request's result was larger than the broker accepts ({detail})."


class DeadLetter(BaseModel):
    """A request message a worker did not run or could not answer, on the dead-letter topic."""

    schema_version: Literal[1] = SCHEMA_VERSION
    reason: DeadLetterReason
    detail: str = Field(description="What was wrong, in words.")
    topic: str = Field(description="Where the message was read.")
    partition: int
    offset: int
    request_id: str | None = Field(default=None, description="The message's, when it names one.")
    reply_topic: str | None = Field(default=None, description="The message's, when a string.")
    value: str = Field(
        description=f"The message's value as UTF-8 text (bad bytes replaced), its first "
        f"{DEAD_LETTER_VALUE_BYTES} bytes."
    )
    value_bytes: int = Field(description="The message's whole size in bytes.")
