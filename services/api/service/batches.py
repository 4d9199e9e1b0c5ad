"""Batches: create (validate, then emit), read, list and cancel, scoped to a project."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from pymongo import DESCENDING

from services.api.schemas import BatchCreateParams
from services.api.service.emitter import RequestEmitter
from services.api.service.files import FileService, page
from services.api.service.idempotency import CreateDeduplicator
from services.api.service.validation import InputValidator
from shared import ids
from shared.documents import batch_from_document, sort_key
from shared.errors import Conflict, InvalidRequest, NotFound
from shared.mongo import Mongo
from shared.protocol.messages import ControlMessage
from shared.protocol.openai import (
    SUPPORTED_ENDPOINTS,
    TERMINAL_STATUSES,
    Batch,
    BatchErrors,
    ListObject,
)
from shared.released_files import purge_if_released
from shared.settings import ApiSettings
from shared.storage import ObjectStore

log = logging.getLogger(__name__)

COMPLETION_WINDOWS = {"24h": 24 * 3600}
MAX_METADATA_PAIRS, MAX_METADATA_KEY, MAX_METADATA_VALUE = 16, 64, 512


def check_metadata(metadata: Any) -> dict[str, str] | None:
    if metadata is None:
        return None
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise InvalidRequest(
            "metadata must be an object of string keys and string values.",
            param="metadata",
            code="invalid_type",
        )
    if len(metadata) > MAX_METADATA_PAIRS or any(
        len(k) > MAX_METADATA_KEY or len(v) > MAX_METADATA_VALUE for k, v in metadata.items()
    ):
        raise InvalidRequest(
            f"metadata allows at most {MAX_METADATA_PAIRS} pairs, keys up to {MAX_METADATA_KEY} "
            f"characters and values up to {MAX_METADATA_VALUE}.",
            param="metadata",
            code="invalid_value",
        )
    return metadata


class BatchService:
    def __init__(
        self,
        mongo: Mongo,
        store: ObjectStore,
        files: FileService,
        emitter: RequestEmitter,
        settings: ApiSettings,
    ) -> None:
        self.mongo = mongo
        self.store = store
        self.files = files
        self.emitter = emitter
        self.settings = settings
        self.dedupe = CreateDeduplicator(mongo, settings.create_dedupe_window_s)
        self._tasks: set[asyncio.Task[None]] = set()
        self.on_dispatchable: Callable[[], None] = lambda: None  # wakes the dispatcher

    async def create(
        self, project: str, params: BatchCreateParams, idempotency_key: str | None = None
    ) -> Batch:
        if params.endpoint not in SUPPORTED_ENDPOINTS:
            raise InvalidRequest(
                f"Unsupported endpoint {params.endpoint!r}; expected one of {list(SUPPORTED_ENDPOINTS)}.",
                param="endpoint",
                code="invalid_value",
            )
        window = COMPLETION_WINDOWS.get(params.completion_window)
        if window is None:
            raise InvalidRequest(
                "completion_window must be '24h'.", param="completion_window", code="invalid_value"
            )
        metadata = check_metadata(params.metadata)
        input_file = await self.files.document(project, params.input_file_id)
        if input_file["purpose"] != "batch":
            raise InvalidRequest(
                f"File {params.input_file_id} has purpose {input_file['purpose']!r}, not 'batch'.",
                param="input_file_id",
                code="invalid_value",
            )
        batch_id = ids.batch_id()
        earlier = await self.dedupe.claim(project, params.model_dump(), idempotency_key, batch_id)
        if earlier is not None:
            log.info("deduplicated a repeated create", extra={"batch_id": earlier})
            return await self.get(project, earlier)
        now = int(time.time())
        doc: dict[str, Any] = {
            "_id": batch_id,
            "project": project,
            "endpoint": params.endpoint,
            "model": None,
            "errors": None,
            "input_file_id": params.input_file_id,
            "completion_window": params.completion_window,
            "status": "validating",
            "created_at": now,
            "sort_key": sort_key(),
            "expires_at": now + window,
            "request_counts": {"total": 0, "completed": 0, "failed": 0},
            "metadata": metadata,
            "defaults": params.defaults().model_dump(),
            "output_expires_after": (
                params.output_expires_after.model_dump() if params.output_expires_after else None
            ),
            "emitted": False,
            "priority": params.priority or 0,
        }
        await self.mongo.batches.insert_one(doc)
        self.start_processing(doc["_id"])
        return batch_from_document(doc)

    async def document(self, project: str, batch_id: str) -> dict[str, Any]:
        doc = await self.mongo.batches.find_one({"_id": batch_id, "project": project})
        if doc is None:
            raise NotFound(f"No such Batch object: {batch_id}", param="batch_id")
        return doc

    async def get(self, project: str, batch_id: str) -> Batch:
        return batch_from_document(await self.document(project, batch_id))

    async def list_page(self, project: str, after: str | None, limit: int) -> ListObject:
        query: dict[str, Any] = {"project": project}
        if after:
            anchor = await self.document(project, after)
            query["sort_key"] = {"$lt": anchor.get("sort_key", 0)}
        cursor = self.mongo.batches.find(query).sort([("sort_key", DESCENDING), ("_id", DESCENDING)])
        docs = await cursor.limit(limit + 1).to_list()
        return page([batch_from_document(d) for d in docs], limit)

    async def cancel(self, project: str, batch_id: str) -> Batch:
        doc = await self.document(project, batch_id)
        if doc["status"] in TERMINAL_STATUSES:
            raise Conflict(
                f"Cannot cancel a batch with status {doc['status']!r}.",
                code="batch_not_cancellable",
            )
        if doc["status"] not in {"cancelling", "cancelled"}:
            await self.mongo.batches.update_one(
                {"_id": batch_id, "status": {"$nin": list(TERMINAL_STATUSES)}},
                {"$set": {"status": "cancelling", "cancelling_at": int(time.time())}},
            )
            await self.emitter.announce(
                ControlMessage(batch_id=batch_id, model=doc.get("model"), cancelled=True)
            )
        return await self.get(project, batch_id)

    # Background work: validation and emission run after the create call has answered.

    def start_processing(self, batch_id: str) -> None:
        task = asyncio.create_task(self._process(batch_id), name=f"process-{batch_id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def recover(self) -> None:
        """Resume batches a previous api process left validating or half emitted."""
        query = {"$or": [{"status": "validating"}, {"status": "in_progress", "emitted": False}]}
        async for doc in self.mongo.batches.find(query, {"_id": 1}):
            log.info("resuming batch", extra={"batch_id": doc["_id"]})
            self.start_processing(doc["_id"])

    async def shutdown(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _process(self, batch_id: str) -> None:
        try:
            doc = await self.mongo.batches.find_one({"_id": batch_id})
            if doc is None:
                return
            if doc["status"] == "validating" and not await self._validate(doc):
                return
            doc = await self.mongo.batches.find_one({"_id": batch_id})
            if doc is None or doc["status"] != "in_progress" or doc.get("emitted"):
                return
            # The dispatcher (services/api/dispatch) streams the lines from the input file.
            await self.mongo.batches.update_one({"_id": batch_id}, {"$set": {"dispatchable": True}})
            self.on_dispatchable()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("processing a batch failed; it resumes on restart", extra={"batch_id": batch_id})

    async def _validate(self, doc: dict[str, Any]) -> bool:
        """Validate the input file; move the batch to in_progress or failed. True when valid."""
        file_doc = await self.mongo.files.find_one({"_id": doc["input_file_id"]})
        now = int(time.time())
        if file_doc is None:
            await self._fail(doc, [{"code": "invalid_request", "message": "The input file was deleted."}])
            return False
        known = {
            m["_id"]: m.get("max_context_length")
            async for m in self.mongo.models.find({}, {"_id": 1, "max_context_length": 1})
        }
        validator = InputValidator(
            endpoint=doc["endpoint"],
            known_models=known,
            max_lines=self.settings.max_batch_lines,
            max_reported_errors=self.settings.max_reported_errors,
        )
        report = await validator.run(self.store.iter_lines(file_doc["object_key"]))
        if not report.ok:
            await self._fail(doc, [e.model_dump() for e in report.errors])
            log.info(
                "batch failed validation",
                extra={"batch_id": doc["_id"], "errors": report.error_count},
            )
            return False
        await self.mongo.batches.update_one(
            {"_id": doc["_id"], "status": "validating"},
            {
                "$set": {
                    "status": "in_progress",
                    "in_progress_at": now,
                    "model": report.model,
                    "request_counts.total": report.lines,
                }
            },
        )
        await self.emitter.announce(
            ControlMessage(
                batch_id=doc["_id"],
                model=report.model,
                total=report.lines,
                expires_at=doc["expires_at"],
            )
        )
        return True

    async def _fail(self, doc: dict[str, Any], errors: list[dict[str, Any]]) -> None:
        await self.mongo.batches.update_one(
            {"_id": doc["_id"]},
            {
                "$set": {
                    "status": "failed",
                    "failed_at": int(time.time()),
                    "errors": BatchErrors.model_validate({"data": errors}).model_dump(),
                }
            },
        )
        await purge_if_released(self.mongo.files, self.mongo.batches, self.store, doc["input_file_id"])
