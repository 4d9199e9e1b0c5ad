"""Stored MongoDB documents: what the api writes and the aggregator and workers read or update.

A stored batch document holds every public ``Batch`` field (``_id`` in place of ``id``) plus the
internal fields below; a stored file document holds every ``FileObject`` field plus ``project`` and
``object_key``. Internal fields never reach a response: the api builds public models from documents.

Batch internal fields:
- ``project``: the project that owns the batch (from the API key).
- ``defaults``: ``SamplingDefaults`` as a dict (batch-level sampling defaults).
- ``sort_key``: nanoseconds at creation (files too); lists sort and page by it.
- ``output_expires_after``: ``{anchor, seconds}`` for the output and error files, or None.
- ``emitted``: True once the dispatcher has published every request line.
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
from typing import Any

from shared.protocol.openai import Batch, FileObject

BATCH_INTERNAL_FIELDS = (
    "project",
    "defaults",
    "emitted",
    "dispatchable",
    "seen_lines",
    "dispatch_settled",
    "output_expires_after",
    "sort_key",
)
FILE_INTERNAL_FIELDS = ("project", "object_key", "deleted", "sort_key")


def sort_key() -> int:
    """Creation order finer than ``created_at`` seconds, so lists page in the order things were made."""
    return time.time_ns()


def batch_from_document(doc: dict[str, Any]) -> Batch:
    fields = {k: v for k, v in doc.items() if k not in BATCH_INTERNAL_FIELDS and k != "_id"}
    fields.update({k: v for k, v in (doc.get("defaults") or {}).items() if v is not None})
    return Batch(id=doc["_id"], **fields)


def file_from_document(doc: dict[str, Any]) -> FileObject:
    fields = {k: v for k, v in doc.items() if k not in FILE_INTERNAL_FIELDS and k != "_id"}
    return FileObject(id=doc["_id"], **fields)


def file_document(public: FileObject, project: str, object_key: str) -> dict[str, Any]:
    doc = public.model_dump()
    doc["_id"] = doc.pop("id")
    doc.update(project=project, object_key=object_key, sort_key=sort_key())
    return doc
