"""The quotas' settings (``BATCHSTREAM_QUOTA_*``); only the api reads them."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class ProjectLimits(BaseModel):
    """One project's limits; 0 means unlimited."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    queued_lines: int = Field(default=0, ge=0)
    enqueued_tokens: int = Field(default=0, ge=0)
    stored_bytes: int = Field(default=0, ge=0)
    batches_in_progress: int = Field(default=0, ge=0)
    concurrent_validations: int = Field(default=0, ge=0)


class ProjectOverride(BaseModel):
    """A project's own limits in ``BATCHSTREAM_QUOTA_PROJECTS``: each field given replaces the
    default (0: unlimited), a field left out keeps it, an unknown field stops the api."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    queued_lines: int | None = Field(default=None, ge=0)
    enqueued_tokens: int | None = Field(default=None, ge=0)
    stored_bytes: int | None = Field(default=None, ge=0)
    batches_in_progress: int | None = Field(default=None, ge=0)
    concurrent_validations: int | None = Field(default=None, ge=0)


class QuotaSettings(BaseSettings):
    """Per-project quotas (docs/operations.md, "Quotas"). Each limit applies to every project
    alone; 0 means unlimited. ``BATCHSTREAM_QUOTA_PROJECTS`` sets a project's own."""

    model_config = SettingsConfigDict(
        env_prefix="BATCHSTREAM_QUOTA_",
        frozen=True,
        extra="ignore",
        use_attribute_docstrings=True,
        env_ignore_empty=True,
    )

    queued_lines: int = Field(default=0, ge=0)
    """Most lines of a project's unfinished batches on one model that have no result yet. A
    create while the project is at the limit answers 429; a batch whose lines would take it past
    the limit fails at validation with ``queued_line_limit_exceeded``. 0: unlimited."""
    enqueued_tokens: int = Field(default=0, ge=0)
    """Most prompt tokens of a project's unfinished batches on one model, estimated (UTF-8 bytes
    of each line's prompt / 4, rounded up; the api has no tokenizer) and counted down as lines get
    results. A create while the project is at the limit answers 429; a batch whose tokens would
    take it past the limit fails at validation with ``token_limit_exceeded``. 0: unlimited."""
    stored_bytes: int = Field(default=0, ge=0)
    """Most bytes of a project's files (uploads and batch output and error files, until deleted
    or expired); an upload that would pass it answers 429. 0: unlimited."""
    batches_in_progress: int = Field(default=1000, ge=0)
    """Most batches of a project not yet ended (validating, in progress, finalizing, cancelling);
    a create past it answers 429. 0: unlimited."""
    concurrent_validations: int = Field(default=32, ge=0)
    """Most batches of a project validating at once (validation reads the whole input file); a
    create past it answers 429. 0: unlimited."""
    retry_after_s: int = Field(default=60, ge=1)
    """``retry-after`` (seconds) of a 429 for queued lines, enqueued tokens, stored bytes or
    batches in progress: they free up as batches finish or files go, which the api cannot
    foresee."""
    validation_retry_after_s: int = Field(default=5, ge=1)
    """``retry-after`` (seconds) of a 429 for concurrent validations (a validation takes seconds)."""
    projects: dict[str, ProjectOverride] = Field(default_factory=dict)
    """JSON object of project to its own limits, e.g. ``{"team-a": {"enqueued_tokens":
    5000000, "stored_bytes": 0}}`` (fields as above, without the prefix; 0: unlimited). A bad
    value or an unknown field stops the api at start-up."""

    def limits(self, project: str) -> ProjectLimits:
        """The project's limits: the defaults, with its override's fields in their place."""
        base = ProjectLimits(
            queued_lines=self.queued_lines,
            enqueued_tokens=self.enqueued_tokens,
            stored_bytes=self.stored_bytes,
            batches_in_progress=self.batches_in_progress,
            concurrent_validations=self.concurrent_validations,
        )
        override = self.projects.get(project)
        if override is None:
            return base
        return base.model_copy(update=override.model_dump(exclude_none=True))
