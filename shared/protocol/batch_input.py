"""Batch input lines, typed: the envelope and the request body each endpoint needs, chosen by
``url`` as vLLM's ``run_batch.py`` does.

The bodies state only what a line cannot run without (the field the endpoint reads and the
positive counts); every other field is kept as written and reaches the engine unchanged.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from shared.protocol.openai import Endpoint

PositiveInt = Annotated[int, Field(strict=True, ge=1)]
NonEmptyText = Annotated[str, Field(min_length=1)]
NonEmptyList = Annotated[list[Any], Field(min_length=1)]


# A UTF-8 byte order mark is accepted at the start of an input file.
UTF8_BOM = b"\xef\xbb\xbf"


class BatchRequestInput(BaseModel):
    """One line of a batch input file (as vLLM's ``run_batch.BatchRequestInput``)."""

    model_config = ConfigDict(extra="ignore")
    custom_id: str
    method: Literal["POST"] = "POST"
    url: Endpoint
    body: dict[str, Any]

    @classmethod
    def parse(cls, raw: bytes) -> BatchRequestInput:
        """A line validation accepted (UTF-8 JSON; a file's leading BOM is dropped)."""
        return cls.model_validate(orjson.loads(raw.removeprefix(UTF8_BOM)))


class RawRequestLine(msgspec.Struct):
    """A line validation accepted, its ``body`` left as raw JSON bytes (the dispatcher forwards
    it unread)."""

    custom_id: str
    url: str
    body: msgspec.Raw


_RAW_LINE = msgspec.json.Decoder(RawRequestLine)


def parse_raw_line(raw: bytes) -> RawRequestLine:
    """The envelope of a line validation accepted (a file's leading BOM is dropped)."""
    return _RAW_LINE.decode(raw.removeprefix(UTF8_BOM))


class RequestBody(BaseModel):
    model_config = ConfigDict(extra="allow")
    max_tokens: PositiveInt | None = None
    max_completion_tokens: PositiveInt | None = None
    n: PositiveInt | None = None


class ChatCompletionBody(RequestBody):
    messages: Annotated[list[dict[str, Any]], Field(min_length=1)]


class CompletionBody(RequestBody):
    prompt: NonEmptyText | NonEmptyList


class EmbeddingBody(RequestBody):
    input: NonEmptyText | NonEmptyList


class ResponsesBody(RequestBody):
    """A Responses request: ``input`` (text or a list of items) and an optional output cap. A
    batch keeps no response, so what needs a stored one (``background``,
    ``previous_response_id``) is refused; ``store`` is accepted and ignored (nothing is stored)."""

    input: NonEmptyText | NonEmptyList
    max_output_tokens: PositiveInt | None = None
    background: Any = None
    previous_response_id: Any = None

    @field_validator("background", "previous_response_id")
    @classmethod
    def _needs_no_store(cls, value: Any, info: ValidationInfo) -> Any:
        if value:
            raise ValueError(f"{info.field_name} is not supported in a batch: no response is stored")
        return value


BODY_BY_ENDPOINT: dict[Endpoint, tuple[type[RequestBody], str]] = {
    "/v1/chat/completions": (ChatCompletionBody, "messages"),
    "/v1/completions": (CompletionBody, "prompt"),
    "/v1/embeddings": (EmbeddingBody, "input"),
    "/v1/responses": (ResponsesBody, "input"),
}
