"""Stored MongoDB documents: the typed batch and file documents the stores read and write.

Each document extends the fields its public model shares with it (``BatchBase``, ``FileBase`` in
shared/protocol/openai.py) and adds only the internal fields below; ``id`` is stored as ``_id`` and
``object`` (the API's type tag) is not stored. Internal fields never reach a response:
:meth:`public` builds the public model from the shared fields alone. A batch's sampling defaults
are stored together in ``defaults``, and ``started_at`` and ``error`` are derived, not stored.

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
- ``resumed``: set when the batch was resumed after the broker lost its messages
  (``BatchProgressStore.resume``): its counts restart from those its stored result chunks give, the
  dispatcher does not send the lines ``seen_lines`` marks, the aggregator counts on from them.
- ``parts``: a mixed-models batch's lines by the base model whose workers run them, set at
  validation: ``[{model, lines}]``; part ``i``'s lines, in dispatch order, are the object
  ``dispatch_order_key(batch_id, i)``. A part whose ``model`` is None holds the lines naming a
  model no worker serves: the dispatcher answers each ``model_not_found``. ``emitted_parts`` and
  ``settled_parts`` list the parts whose lines all went / all came back (``emitted`` and
  ``dispatch_settled`` are set once every part's is).
- ``enqueued``: ``{model: {lines, tokens}}``, the batch's lines per model they name and their
  estimated prompt tokens, set at validation with ``enqueued_at`` (nanoseconds); the api's
  quotas count them down as lines get results (services/api/quotas/limits.py).
- ``completion_rate``: ``[at, lines_per_s]``, the batch's lines done per second over the last
  minute (services/aggregator/completion_rate.py), written with each live counts flush (null
  until it can be told).
- ``expected_tokens``: the lines' expected output tokens summed at validation
  (shared/expected_output.py), null when a line has no output cap; ``engine_progress``:
  ``{worker: EngineProgress}``, each worker's progress on the batch's lines
  (shared/completion_estimate.py). ``public`` derives the estimated completion time from these
  and ``completion_rate``.
- ``not_run_counts``: ``{code: lines}``, the failed lines that never ran by their error code
  (``batch_cancelled``, ``batch_expired``), counted by the aggregator as it writes the error file
  (Anthropic's ``canceled`` and ``expired`` counts); null for a batch not finalized by it.
- ``api``: the API the batch was created through and is shown by: ``openai`` (``/v1/batches``)
  or ``anthropic`` (``/v1/messages/batches``, shared/protocol/anthropic.py).
- ``progress``: ``[at, completed, failed]`` per live counts flush, the last ``PROGRESS_SAMPLES``
  of them (the console's plot of lines over time; pushed on the flush's own write).

Model documents (``models`` collection), upserted by inference workers as a heartbeat
(``shared/stores/models.py``): ``{_id: model_id, created: int, max_context_length: int,
endpoints: [str], last_seen: float, workers: [{id: "host:pid", last_seen: float}]}``.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from shared import completion_estimate
from shared.protocol.messages import SamplingDefaults
from shared.protocol.openai import COMPLETION_WINDOW, Batch, BatchBase, FileBase, FileObject

PROGRESS_SAMPLES = 600
"""How many progress samples a batch document keeps (the newest)."""


def sort_key() -> int:
    """Creation order finer than ``created_at`` seconds, so lists page in the order things were made."""
    return time.time_ns()


class StoredDocument(BaseModel):
    """A MongoDB document: ``id`` is stored as ``_id``; unknown stored fields are ignored.

    Listed first among a document's bases, so its ``id`` (with the alias) is the one that counts.
    """

    model_config = ConfigDict(populate_by_name=True, extra="ignore")
    id: str = Field(alias="_id")

    def to_mongo(self) -> dict[str, Any]:
        # ``object`` is the public model's type tag ("batch", "file"): the collection says it.
        return self.model_dump(by_alias=True, exclude={"object"})


class BatchDocument(StoredDocument, BatchBase):
    # The stored documents' default; the API's Batch always carries the window given at create.
    completion_window: str = COMPLETION_WINDOW
    project: str = "default"
    defaults: SamplingDefaults = Field(default_factory=SamplingDefaults)
    sort_key: int = 0
    output_expires_after: dict[str, Any] | None = None
    emitted: bool = False
    attempts: int = 0
    dispatchable: bool = False
    dispatch_settled: bool = False
    seen_lines: bytes | None = None
    resumed: bool = False
    parts: list[dict[str, Any]] | None = None
    emitted_parts: list[int] = Field(default_factory=list)
    settled_parts: list[int] = Field(default_factory=list)
    enqueued: dict[str, dict[str, int]] | None = None
    enqueued_at: int | None = None
    end_recorded: bool | None = None  # False from a terminal move until its end listener ran
    completion_rate: list[float] | None = None
    expected_tokens: int | None = None
    engine_progress: dict[str, Any] = Field(default_factory=dict)  # {} so workers can add to it
    not_run_counts: dict[str, int] | None = None
    api: Literal["openai", "anthropic"] = "openai"

    def output_files_expire_at(self) -> int | None:
        """When the output and error files expire: ``output_expires_after`` from its anchor (the
        batch's ``created_at``, the only anchor the API accepts), or never."""
        after = self.output_expires_after
        if not after or after.get("anchor") != "created_at":
            return None
        return self.created_at + int(after["seconds"])

    def public(self) -> Batch:
        shared = self.model_dump(include=set(BatchBase.model_fields))
        first_error = self.errors.data[0] if self.errors and self.errors.data else None
        return Batch(
            **shared,
            **self.defaults.model_dump(),
            started_at=self.in_progress_at,
            error=first_error,
            **self.estimate(),
        )

    def estimate(self) -> dict[str, Any]:
        """``estimated_completion_at`` and the rates behind it (docs/api.md): while the batch is in
        progress, by its expected work or its lines (``shared/completion_estimate.py``); otherwise
        null."""
        at = lines_per_s = tokens_per_s = None
        if self.status == "in_progress":
            counts = self.request_counts
            remaining = max(0, counts.total - counts.completed - counts.failed)
            at, lines_per_s, tokens_per_s = completion_estimate.estimate(
                remaining, self.expected_tokens, self.engine_progress, self.completion_rate, time.time()
            )
        return {
            "estimated_completion_at": at,
            "estimated_rate_lines_per_s": lines_per_s,
            "estimated_rate_tokens_per_s": tokens_per_s,
        }


class FileDocument(StoredDocument, FileBase):
    project: str = "default"
    object_key: str
    deleted: bool = False
    sort_key: int = Field(default_factory=sort_key)

    @classmethod
    def of(cls, public: FileObject, project: str, object_key: str) -> FileDocument:
        return cls(**public.model_dump(), project=project, object_key=object_key)

    def public(self) -> FileObject:
        return FileObject.model_validate(self.model_dump(include=set(FileBase.model_fields)))


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
