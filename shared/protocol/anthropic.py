"""Anthropic's Message Batches objects, field names and literals exactly as the API's (the
``anthropic`` SDK's ``types/messages/``), and the pure mappings from a batchstream batch and its
output and error lines to them.

A message batch is a batch like any other inside (its lines run ``/v1/messages``); only what the
client sees is Anthropic's: this module owns that view.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Final, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field

from shared.lifecycle import TERMINAL
from shared.protocol.openai import BatchBase
from shared.protocol.result_message import UNDELIVERABLE_CODE, NotRunCode
from shared.stores.models import MODEL_NOT_FOUND

ANTHROPIC_API: Final = "anthropic"
"""The ``api`` of a stored batch created through ``/v1/messages/batches``."""
_CANCELLED: Final[NotRunCode] = "batch_cancelled"
_EXPIRED: Final[NotRunCode] = "batch_expired"

MESSAGE_BATCHES_PATH = "/v1/messages/batches"
"""Where Anthropic's Message Batches API is served (its routes, the body limit, the client)."""
CUSTOM_ID_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"
"""Anthropic's rule for a request's ``custom_id``."""

ProcessingStatus = Literal["in_progress", "canceling", "ended"]

# HTTP status -> Anthropic's error type (its "Errors" page).
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}


def error_type(status: int) -> str:
    """Anthropic's error ``type`` for an HTTP status (any other 4xx: invalid request; 5xx: api)."""
    return _ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")


class AnthropicErrorObject(BaseModel):
    type: str
    message: str


class AnthropicErrorResponse(BaseModel):
    """``{"type": "error", "error": {"type", "message"}}``: every error body of the Message
    Batches API, and an errored request's ``result.error``."""

    type: Literal["error"] = "error"
    error: AnthropicErrorObject

    @classmethod
    def of(cls, status: int, message: str) -> AnthropicErrorResponse:
        return cls(error=AnthropicErrorObject(type=error_type(status), message=message))


class MessageBatchRequest(BaseModel):
    """One entry of ``requests``: its ``params`` are checked per request by the service (each bad
    request named by its ``custom_id``), so here they are any object."""

    model_config = ConfigDict(extra="forbid")
    custom_id: Any = None
    params: Any = None


class MessageBatchCreateParams(BaseModel):
    """``POST /v1/messages/batches``."""

    model_config = ConfigDict(extra="forbid")
    requests: list[MessageBatchRequest]


class MessageBatchRequestCounts(BaseModel):
    processing: int = 0
    succeeded: int = 0
    errored: int = 0
    canceled: int = 0
    expired: int = 0


class MessageBatch(BaseModel):
    id: str
    type: Literal["message_batch"] = "message_batch"
    processing_status: ProcessingStatus
    request_counts: MessageBatchRequestCounts
    ended_at: str | None = None
    created_at: str
    expires_at: str
    archived_at: str | None = None
    cancel_initiated_at: str | None = None
    results_url: str | None = None


class MessageBatchList(BaseModel):
    data: list[MessageBatch] = Field(default_factory=list)
    has_more: bool = False
    first_id: str | None = None
    last_id: str | None = None


class DeletedMessageBatch(BaseModel):
    id: str
    type: Literal["message_batch_deleted"] = "message_batch_deleted"


def rfc3339(ts: int | None) -> str | None:
    """Unix seconds as Anthropic writes times (RFC 3339, UTC, ``Z``)."""
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


def processing_status(batch: BatchBase) -> ProcessingStatus:
    if batch.status in TERMINAL:
        return "ended"
    return "canceling" if batch.status == "cancelling" else "in_progress"


def ended_at(batch: BatchBase) -> int | None:
    return batch.completed_at or batch.cancelled_at or batch.expired_at or batch.failed_at


def request_counts(batch: BatchBase, not_run: dict[str, int] | None) -> MessageBatchRequestCounts:
    """The counts as Anthropic tallies them; they always sum to the batch's requests.

    Live while the batch runs (``processing`` the requests without a result so far, the results so
    far under ``succeeded`` and ``errored``); ``not_run``, once it ended, is how many of its failed
    lines never ran: ``{"batch_cancelled": n, "batch_expired": m}`` (counted at finalize)."""
    counts = batch.request_counts
    if batch.status not in TERMINAL:
        done = counts.completed + counts.failed
        return MessageBatchRequestCounts(
            processing=max(counts.total - done, 0), succeeded=counts.completed, errored=counts.failed
        )
    not_run = not_run or {}
    canceled, expired = not_run.get(_CANCELLED, 0), not_run.get(_EXPIRED, 0)
    return MessageBatchRequestCounts(
        succeeded=counts.completed,
        errored=max(counts.failed - canceled - expired, 0),
        canceled=canceled,
        expired=expired,
    )


def message_batch(batch: BatchBase, not_run: dict[str, int] | None, results_url: str) -> MessageBatch:
    """The stored batch as Anthropic's ``MessageBatch``; ``results_url`` is set once it ended."""
    status = processing_status(batch)
    created = rfc3339(batch.created_at)
    assert created is not None
    return MessageBatch(
        id=batch.id,
        processing_status=status,
        request_counts=request_counts(batch, not_run),
        ended_at=rfc3339(ended_at(batch)) if status == "ended" else None,
        created_at=created,
        expires_at=rfc3339(batch.expires_at) or created,
        cancel_initiated_at=rfc3339(batch.cancelling_at),
        results_url=results_url if status == "ended" else None,
    )


NOT_RUN_RESULTS: Final[dict[str, Literal["canceled", "expired"]]] = {
    _CANCELLED: "canceled",
    _EXPIRED: "expired",
}
"""A line that never ran, by its error code: its result ``type``."""


def result_line(raw: bytes) -> bytes | None:
    """One line of the batch's output or error file as one line of Anthropic's results
    (``{"custom_id", "result": {...}}``, newline-terminated); None for a blank line."""
    if not raw.strip():
        return None
    line = orjson.loads(raw)
    response, error = line.get("response"), line.get("error")
    result: dict[str, Any]
    if response is not None and response.get("status_code") == 200:
        result = {"type": "succeeded", "message": response.get("body")}
    elif response is not None:
        result = {
            "type": "errored",
            "error": _error_body(response.get("status_code", 500), response.get("body")),
        }
    else:
        code = (error or {}).get("code", "")
        kind = NOT_RUN_RESULTS.get(code)
        if kind is not None:
            result = {"type": kind}
        else:
            message = (error or {}).get("message") or code or "The request failed."
            status = 404 if code == MODEL_NOT_FOUND else 500 if code == UNDELIVERABLE_CODE else 400
            result = {"type": "errored", "error": AnthropicErrorResponse.of(status, message).model_dump()}
    return orjson.dumps({"custom_id": line.get("custom_id"), "result": result}) + b"\n"


def _error_body(status: int, body: Any) -> dict[str, Any]:
    """An engine's error body in Anthropic's shape, its ``type`` Anthropic's for the status: from
    Anthropic's shape (vLLM's Messages route) or OpenAI's envelope (``{"error": {"message"}}``)."""
    detail = body.get("error") if isinstance(body, dict) else None
    message = detail.get("message") if isinstance(detail, dict) else None
    return AnthropicErrorResponse.of(status, str(message or "The request failed.")).model_dump()
