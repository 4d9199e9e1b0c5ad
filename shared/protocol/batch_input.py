"""Batch input lines, typed: the envelope and the request body each endpoint needs, chosen by
``url`` as vLLM's ``run_batch.py`` does.

The bodies state only what a line cannot run without (the field the endpoint reads and the
positive counts); every other field is kept as written and reaches the engine unchanged.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

import msgspec
import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from shared.protocol.openai import CHAT, COMPLETIONS, EMBEDDINGS, MESSAGES, RERANK, RESPONSES, SCORE, Endpoint

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

    @classmethod
    def missing(cls, body: dict[str, Any], required: str) -> str | None:
        """The field the endpoint reads that ``body`` lacks (``required``), or None."""
        return required if body.get(required) is None else None


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


class MessagesBody(RequestBody):
    """An Anthropic Messages request (vLLM's ``AnthropicMessagesRequest``): ``messages`` and the
    ``max_tokens`` Anthropic requires."""

    messages: Annotated[list[dict[str, Any]], Field(min_length=1)]
    max_tokens: PositiveInt


# A score input as vLLM's ``ScoreInput``: a text, or ``{"content": [...]}`` for a multimodal
# model; or a list of them, which vLLM refuses empty.
ScoreInput = str | dict[str, Any]
ScoreInputs = ScoreInput | Annotated[list[ScoreInput], Field(min_length=1)]


class ScoreBody(RequestBody):
    """vLLM's ``ScoreRequest``: one of its pairs of inputs (``PAIRS``), scored 1:1, 1:N or N:N."""

    PAIRS: ClassVar[tuple[tuple[str, str], ...]] = (
        ("queries", "documents"),
        ("queries", "items"),
        ("text_1", "text_2"),
        ("data_1", "data_2"),
    )
    queries: ScoreInputs | None = None
    documents: ScoreInputs | None = None
    items: ScoreInputs | None = None
    text_1: ScoreInputs | None = None
    text_2: ScoreInputs | None = None
    data_1: ScoreInputs | None = None
    data_2: ScoreInputs | None = None

    @classmethod
    def missing(cls, body: dict[str, Any], required: str) -> str | None:
        """None when a pair is whole; else the other half of a pair begun, else ``required``."""
        given = {name for pair in cls.PAIRS for name in pair if body.get(name) is not None}
        if any(first in given and second in given for first, second in cls.PAIRS):
            return None
        for first, second in cls.PAIRS:
            if first in given or second in given:
                return second if first in given else first
        return required

    @field_validator("documents", "items", "text_2", "data_2")
    @classmethod
    def _pairs_up(cls, value: Any, info: ValidationInfo) -> Any:
        """vLLM's rule: several first inputs need as many second ones (N:N); one takes any (1:N)."""
        first_name = {"text_2": "text_1", "data_2": "data_1"}.get(str(info.field_name), "queries")
        first = info.data.get(first_name)
        count = len(value) if isinstance(value, list) else 1
        if isinstance(first, list) and len(first) > 1 and value is not None and count != len(first):
            raise ValueError(f"{len(first)} {first_name} need as many {info.field_name}, not {count}")
        return value


class RerankBody(RequestBody):
    """vLLM's ``RerankRequest``: one ``query``, the ``documents`` to order, an optional ``top_n``."""

    query: ScoreInput
    documents: ScoreInputs
    top_n: Annotated[int, Field(strict=True, ge=0)] | None = None


BODY_BY_ENDPOINT: dict[Endpoint, tuple[type[RequestBody], str]] = {
    CHAT: (ChatCompletionBody, "messages"),
    COMPLETIONS: (CompletionBody, "prompt"),
    EMBEDDINGS: (EmbeddingBody, "input"),
    RESPONSES: (ResponsesBody, "input"),
    MESSAGES: (MessagesBody, "messages"),
    SCORE: (ScoreBody, "queries"),
    RERANK: (RerankBody, "query"),
}
