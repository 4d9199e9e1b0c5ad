"""Stored MongoDB documents: the typed batch and file documents the stores read and write.

A stored batch document holds every public ``Batch`` field (``_id`` in place of ``id``) plus the
internal fields below; a stored file document holds every ``FileObject`` field plus ``project``,
``object_key`` and ``deleted``. Internal fields never reach a response: :meth:`public` builds the
public model.

Batch internal fields:
- ``project``: the project that owns the batch (from the API key).
- ``defaults``: the batch-level ``SamplingDefaults``.
- ``sort_key``: nanoseconds at creation (files too); lists sort and page by it.
- ``output_expires_after``: ``{anchor, seconds}`` for the output and error files, or None.
- ``emitted``: True once the dispatcher has published every request line.
- ``attempts``: how many times processing (validation) of the batch has started; a batch that
  keeps failing ends ``failed`` after a bounded number (no poison batch).
- ``dispatchable``: set once the batch is validated: the api's dispatcher streams its lines from
  the input file (its read position lives in ``dispatch_positions``, see services/api/dispatch).
- ``priority``: the dispatch priority given at create (also public: echoed on the Batch).
- ``dispatch_settled``: set by the dispatcher on a cancelling batch once every line it sent came
  back: the aggregator then ends it without waiting for its cancel timeout.
- ``seen_lines``: the aggregator's seen-lines bitmap (zlib-compressed bytes, bit ``n - 1`` for
  line ``n``), written with its batched counts flush; the dispatcher reads it to find lost lines.

Model documents (``models`` collection), upserted by inference workers as a heartbeat:
``{_id: model_id, created: int, max_context_length: int, endpoints: [str], last_seen: float}``.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from shared.lifecycle import BatchStatus
from shared.protocol.messages import SamplingDefaults
from shared.protocol.openai import Batch, BatchErrors, BatchUsage, FileObject, RequestCounts


def sort_key() -> int:
    """Creation order finer than ``created_at`` seconds, so lists page in the order things were made."""
    return time.time_ns()


class StoredDocument(BaseModel):
    """A MongoDB document: ``id`` is stored as ``_id``; unknown stored fields are ignored."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore")
    id: str = Field(alias="_id")

    def to_mongo(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True)


# Stored on the batch, never in a response.
INTERNAL_BATCH_FIELDS = {
    "id",
    "project",
    "defaults",
    "sort_key",
    "output_expires_after",
    "emitted",
    "attempts",
    "dispatchable",
    "dispatch_settled",
    "seen_lines",
    "end_recorded",
}


class BatchDocument(StoredDocument):
    project: str = "default"
    endpoint: str
    model: str | None = None
    errors: BatchErrors | None = None
    input_file_id: str
    completion_window: str = "24h"
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
    defaults: SamplingDefaults = Field(default_factory=SamplingDefaults)
    sort_key: int = 0
    output_expires_after: dict[str, Any] | None = None
    emitted: bool = False
    attempts: int = 0
    priority: int = 0
    prefix_order: bool = False  # asked for at create; after validation: whether an order exists
    dispatchable: bool = False
    dispatch_settled: bool = False
    seen_lines: bytes | None = None
    end_recorded: bool | None = None  # False from a terminal move until its end listener ran

    def output_files_expire_at(self) -> int | None:
        """When the output and error files expire: ``output_expires_after`` from its anchor (the
        batch's ``created_at``, the only anchor the API accepts), or never."""
        after = self.output_expires_after
        if not after or after.get("anchor") != "created_at":
            return None
        return self.created_at + int(after["seconds"])

    def public(self) -> Batch:
        fields = self.model_dump(exclude=INTERNAL_BATCH_FIELDS)
        fields.update(self.defaults.model_dump(exclude_none=True))
        first_error = self.errors.data[0] if self.errors and self.errors.data else None
        return Batch(id=self.id, started_at=self.in_progress_at, error=first_error, **fields)


class FileDocument(StoredDocument):
    bytes: int
    created_at: int
    filename: str
    purpose: str
    status: str = "processed"
    expires_at: int | None = None
    status_details: str | None = None
    checksum: str | None = None
    project: str = "default"
    object_key: str
    deleted: bool = False
    sort_key: int = Field(default_factory=sort_key)

    @classmethod
    def of(cls, public: FileObject, project: str, object_key: str) -> FileDocument:
        fields = public.model_dump(exclude={"id", "object"})
        return cls(_id=public.id, project=project, object_key=object_key, **fields)

    def public(self) -> FileObject:
        return FileObject.model_validate(
            self.model_dump(exclude={"project", "object_key", "deleted", "sort_key"})
        )


class WebhookEventDocument(StoredDocument):
    """One batch event to deliver (``webhook_events`` collection, ``shared/stores/webhooks.py``).

    ``status`` is ``pending`` until a receiver answers 2xx (``delivered``) or the event is older
    than the retry window (``failed``). ``attempts`` counts attempts started; ``lease_until`` and
    ``lease_token`` mark the deliverer that owns the attempt in flight.
    """

    project: str
    type: str
    batch_id: str
    created_at: int
    status: Literal["pending", "delivered", "failed"] = "pending"
    attempts: int = 0
    next_attempt_at: float = 0.0
    lease_until: float = 0.0
    lease_token: str | None = None
    last_error: str | None = None
    delivered_at: float | None = None
