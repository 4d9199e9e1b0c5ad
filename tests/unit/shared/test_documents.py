"""The stored documents: the fields a batch and a file are stored with, and the public models built
from them, which carry none of the internal fields."""

from __future__ import annotations

from typing import Any

from shared.documents import BatchDocument, FileDocument
from shared.protocol.messages import SamplingDefaults
from shared.protocol.openai import Batch, BatchError, BatchErrors, FileObject

STORED_BATCH_FIELDS = {
    "_id",
    "endpoint",
    "model",
    "errors",
    "input_file_id",
    "completion_window",
    "status",
    "output_file_id",
    "error_file_id",
    "created_at",
    "in_progress_at",
    "expires_at",
    "finalizing_at",
    "completed_at",
    "failed_at",
    "expired_at",
    "cancelling_at",
    "cancelled_at",
    "request_counts",
    "metadata",
    "usage",
    "priority",
    "prefix_order",
    "mixed_models",
    "usage_by_model",
    "project",
    "defaults",
    "sort_key",
    "output_expires_after",
    "emitted",
    "attempts",
    "dispatchable",
    "dispatch_settled",
    "seen_lines",
    "resumed",
    "parts",
    "emitted_parts",
    "settled_parts",
    "enqueued",
    "enqueued_at",
    "end_recorded",
    "api",
    "completion_rate",
    "expected_tokens",
    "engine_progress",
    "not_run_counts",
}
STORED_FILE_FIELDS = {
    "_id",
    "bytes",
    "created_at",
    "filename",
    "purpose",
    "status",
    "expires_at",
    "status_details",
    "checksum",
    "project",
    "object_key",
    "deleted",
    "sort_key",
}


def failed_batch() -> BatchDocument:
    error = BatchError(code="invalid_json", message="bad", line=2)
    return BatchDocument(
        _id="batch_1",
        project="p",
        endpoint="/v1/chat/completions",
        model="m",
        errors=BatchErrors(data=[error]),
        input_file_id="file-in",
        status="failed",
        created_at=100,
        in_progress_at=101,
        expires_at=200,
        failed_at=102,
        metadata={"team": "search"},
        defaults=SamplingDefaults(temperature=0.5, top_k=5),
        sort_key=7,
        output_expires_after={"anchor": "created_at", "seconds": 3600},
        emitted=True,
        attempts=2,
        priority=3,
        dispatchable=True,
        seen_lines=b"\x01",
        end_recorded=True,
    )


def test_a_batch_is_stored_with_its_public_fields_under_id_and_its_internal_ones() -> None:
    stored = failed_batch().to_mongo()
    assert set(stored) == STORED_BATCH_FIELDS
    assert stored["_id"] == "batch_1" and stored["defaults"]["temperature"] == 0.5
    line_error = {"code": "invalid_json", "message": "bad", "param": None, "line": 2}
    assert stored["errors"] == {"object": "list", "data": [line_error]}


def test_a_stored_batch_reads_back_as_it_was_written() -> None:
    batch = failed_batch()
    assert BatchDocument.model_validate(batch.to_mongo()) == batch


def test_a_stored_batch_with_only_the_required_fields_takes_the_defaults() -> None:
    minimal = {"_id": "b", "endpoint": "/v1/embeddings", "input_file_id": "f", "status": "validating"}
    batch = BatchDocument.model_validate({**minimal, "created_at": 1, "unknown": "ignored"})
    assert (batch.project, batch.completion_window, batch.priority) == ("default", "24h", 0)
    assert batch.sort_key == 0 and batch.end_recorded is None
    assert batch.request_counts.total == 0 and batch.usage.total_tokens == 0 and not batch.emitted


def test_the_public_batch_has_exactly_the_api_s_fields() -> None:
    public = failed_batch().public()
    assert type(public) is Batch
    body = public.model_dump(mode="json")
    assert set(body) == set(Batch.model_fields)
    assert body["id"] == "batch_1" and body["object"] == "batch" and body["priority"] == 3
    assert (body["started_at"], body["error"]["code"]) == (101, "invalid_json")
    assert (body["temperature"], body["top_k"], body["top_p"]) == (0.5, 5, None)
    assert body["errors"]["data"][0]["line"] == 2 and body["metadata"] == {"team": "search"}


def test_a_batch_without_errors_has_no_error() -> None:
    batch = failed_batch().model_copy(update={"errors": None, "in_progress_at": None})
    assert (batch.public().error, batch.public().started_at) == (None, None)


def uploaded() -> FileObject:
    return FileObject(
        id="file-1",
        bytes=5,
        created_at=100,
        filename="in.jsonl",
        purpose="batch",
        expires_at=200,
        checksum="sha256:00",
    )


def test_a_file_is_stored_with_its_public_fields_under_id_and_its_internal_ones() -> None:
    stored = FileDocument.of(uploaded(), "p", "files/file-1").to_mongo()
    assert set(stored) == STORED_FILE_FIELDS
    assert (stored["_id"], stored["object_key"], stored["deleted"]) == ("file-1", "files/file-1", False)
    assert stored["sort_key"] > 0


def test_the_public_file_is_the_file_it_was_stored_from() -> None:
    document = FileDocument.of(uploaded(), "p", "files/file-1")
    public = FileDocument.model_validate(document.to_mongo()).public()
    assert type(public) is FileObject
    assert public.model_dump() == uploaded().model_dump()


def test_a_stored_file_takes_the_defaults() -> None:
    fields: dict[str, Any] = {"_id": "f", "bytes": 1, "created_at": 1, "filename": "a", "purpose": "batch"}
    document = FileDocument.model_validate({**fields, "object_key": "files/f"})
    assert (document.project, document.status, document.deleted) == ("default", "processed", False)
    assert document.public().status == "processed"
