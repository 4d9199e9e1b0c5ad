"""OpenAI Files and Batches objects, field names and literals exactly as the API's."""

from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import BaseModel, Field

from shared.lifecycle import BatchStatus
from shared.protocol.messages import SamplingDefaults

Endpoint = Literal[
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/responses",
    # Anthropic's Messages API, as vLLM serves it (a message batch's lines; docs/api.md).
    "/v1/messages",
    # vLLM's extensions beside OpenAI's: a cross-encoder on the pooling runner scores text pairs.
    "/v1/score",
    "/v1/rerank",
]
SUPPORTED_ENDPOINTS: tuple[Endpoint, ...] = get_args(Endpoint)
"""The one list of the endpoints a batch line may name; the names below are its members."""
CHAT, COMPLETIONS, EMBEDDINGS, RESPONSES, MESSAGES, SCORE, RERANK = SUPPORTED_ENDPOINTS
GENERATE_ENDPOINTS: tuple[Endpoint, ...] = (CHAT, COMPLETIONS, RESPONSES, MESSAGES)
"""The endpoints a generative model serves (the others run on the pooling runner)."""

COMPLETION_WINDOW = "24h"
"""A batch's completion window when it names none: OpenAI's one window."""
COMPLETION_WINDOWS: dict[str, int] = {COMPLETION_WINDOW: 24 * 3600}
"""The completion windows a batch may ask for, in seconds."""


class FileBase(BaseModel):
    """A file's fields as the API returns them and as they are stored: ``FileObject`` and the
    stored ``FileDocument`` (shared/documents.py) both extend this, neither the other, so a stored
    document never passes for a response (pydantic hands an instance of a subclass through
    ``model_validate`` as it is, internal fields and all)."""

    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int
    filename: str
    purpose: str
    status: Literal["uploaded", "processed", "error"] = "processed"
    expires_at: int | None = None
    status_details: str | None = None
    # From the batch API batchstream replaces: "sha256:<hex>" of the stored bytes.
    checksum: str | None = None


class FileObject(FileBase):
    # A file as the API returns it (no docstring: it would become the OpenAPI description).
    pass


class FileDeleted(BaseModel):
    id: str
    object: Literal["file"] = "file"
    deleted: bool = True


class BatchError(BaseModel):
    code: str
    message: str
    param: str | None = None
    line: int | None = None


class BatchErrors(BaseModel):
    object: Literal["list"] = "list"
    data: list[BatchError] = Field(default_factory=list)


class RequestCounts(BaseModel):
    total: int = 0
    completed: int = 0
    failed: int = 0


class InputTokensDetails(BaseModel):
    cached_tokens: int = 0


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class BatchUsage(BaseModel):
    input_tokens: int = 0
    input_tokens_details: InputTokensDetails = Field(default_factory=InputTokensDetails)
    output_tokens: int = 0
    output_tokens_details: OutputTokensDetails = Field(default_factory=OutputTokensDetails)
    total_tokens: int = 0


class BatchBase(BaseModel):
    """A batch's fields as the API returns them and as they are stored: ``Batch`` and the stored
    ``BatchDocument`` (shared/documents.py) both extend this (see ``FileBase``)."""

    id: str
    object: Literal["batch"] = "batch"
    endpoint: str
    model: str | None = None
    errors: BatchErrors | None = None
    input_file_id: str
    completion_window: str
    status: BatchStatus
    output_file_id: str | None = None
    error_file_id: str | None = None
    created_at: int
    in_progress_at: int | None = None
    expires_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    request_counts: RequestCounts = Field(default_factory=RequestCounts)
    metadata: dict[str, str] | None = None
    usage: BatchUsage = Field(default_factory=BatchUsage)
    # batchstream's dispatch priority (an extension; higher first; 0 unless given at create).
    priority: int = 0
    # batchstream's extension: asked for at create; after validation, whether the lines are sent
    # in a dispatch order (docs/dispatcher.md, "Prefix order").
    prefix_order: bool = False
    # batchstream's extension: lines may name different models and LoRA adapters (asked for at
    # create; docs/api.md, "Mixed batches").
    mixed_models: bool = False
    # batchstream's extension, of a mixed batch once it has ended: ``usage`` per model or adapter.
    usage_by_model: dict[str, BatchUsage] | None = None


class Batch(BatchBase, SamplingDefaults):
    """A batch; batchstream's batch-level sampling defaults (``SamplingDefaults``) are echoed as
    given at create (null when unset)."""

    # From the batch API batchstream replaces: when lines started (= in_progress_at) and the
    # failure's details (= the first of errors.data).
    started_at: int | None = None
    error: BatchError | None = None
    # batchstream's extensions, while the batch is in progress (docs/api.md, "Estimated completion"):
    # when its lines will be done (unix seconds), and the rates behind it; else null.
    estimated_completion_at: int | None = None
    estimated_rate_lines_per_s: float | None = None
    estimated_rate_tokens_per_s: float | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "batchstream"
    max_context_length: int | None = None
    # A LoRA adapter's base model (served by that model's workers); None for a base model.
    parent: str | None = None


class ListObject(BaseModel):
    object: Literal["list"] = "list"
    data: list[Any]
    has_more: bool = False
    first_id: str | None = None
    last_id: str | None = None
