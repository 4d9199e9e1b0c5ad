"""batchstream's own API objects, beside OpenAI's (shared/protocol/openai.py): the views the web
console reads, each also an endpoint any client may call (docs/api.md, "Extensions")."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from shared.protocol.openai import ModelCard


class ProgressSample(BaseModel):
    """Counts at one moment of a running batch (the aggregator's live counts flush)."""

    at: float = Field(description="Unix time of the sample, seconds.")
    completed: int
    failed: int


class BatchProgress(BaseModel):
    object: Literal["batch.progress"] = "batch.progress"
    batch_id: str
    total: int
    data: list[ProgressSample]


class ErrorLine(BaseModel):
    """One line of a batch's error lines with what it is searched by."""

    line: int = Field(description="1-based position among the error lines (not the input line).")
    custom_id: str
    code: str = Field(description="The error's code: error.code, or the engine's error type/code.")
    message: str
    status_code: int | None = None
    raw: dict[str, Any] = Field(description="The error line as the error file holds it.")


class ErrorLinesPage(BaseModel):
    object: Literal["list"] = "list"
    data: list[ErrorLine]
    has_more: bool = False
    next_offset: int | None = Field(default=None, description="Pass as offset for the next page.")


class WorkerStatus(BaseModel):
    id: str = Field(description="host:pid of the inference worker.")
    last_seen: float
    alive: bool


class ModelStatus(ModelCard):
    """A model card with its workers and the lines waiting for it."""

    workers: list[WorkerStatus] = Field(default_factory=list)
    queued_lines: int = Field(
        0, description="Lines of this project's running batches still without a result."
    )
    running_batches: int = Field(0, description="This project's batches of the model still running.")


class UsageRow(BaseModel):
    """A project's batches of one model created on one UTC day."""

    day: str = Field(description="YYYY-MM-DD (UTC) of the batches' created_at.")
    model: str
    batches: int
    completed: int
    failed: int
    input_tokens: int
    cached_tokens: int
    output_tokens: int
    total_tokens: int


class LimitUse(BaseModel):
    """One quota of a project and its use (``GET /v1/limits``)."""

    limit: int | None = Field(description="The limit; null when unlimited.")
    used: int

    @classmethod
    def of(cls, limit: int, used: int) -> LimitUse:
        return cls(limit=limit or None, used=used)


class ModelLimits(BaseModel):
    """A project's per-model quotas on one model and its use of them."""

    model: str
    queued_lines: LimitUse = Field(description="Lines of unfinished batches without a result yet.")
    enqueued_tokens: LimitUse = Field(
        description="Prompt tokens of those lines, estimated: UTF-8 bytes / 4, rounded up."
    )


class ProjectLimitsView(BaseModel):
    """``GET /v1/limits``: the calling project's quotas and its use of each."""

    object: Literal["limits"] = "limits"
    project: str
    stored_bytes: LimitUse = Field(description="Bytes of the project's files.")
    batches_in_progress: LimitUse = Field(description="Batches not yet ended.")
    concurrent_validations: LimitUse = Field(description="Batches validating now.")
    models: list[ModelLimits] = Field(description="Per model: served models and those with use.")
