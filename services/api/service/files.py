"""Files: bytes streamed to object storage, documents in MongoDB, scoped to a project."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import IO, Any

from pymongo import ASCENDING, DESCENDING

from shared import ids
from shared.documents import file_document, file_from_document
from shared.errors import InvalidRequest, NotFound, PayloadTooLarge
from shared.mongo import Mongo
from shared.protocol.openai import FileObject, ListObject
from shared.released_files import purge_if_released
from shared.settings import ApiSettings
from shared.storage import ObjectStore, file_key

PURPOSES = {"batch", "batch_output", "user_data", "fine-tune", "assistants", "vision", "evals"}
MIN_EXPIRY_S, MAX_EXPIRY_S = 3600, 2_592_000


class FileService:
    def __init__(self, mongo: Mongo, store: ObjectStore, settings: ApiSettings) -> None:
        self.mongo = mongo
        self.store = store
        self.settings = settings

    async def upload(
        self,
        project: str,
        stream: IO[bytes],
        size: int | None,
        filename: str,
        purpose: str,
        expires_after_seconds: int | None = None,
    ) -> FileObject:
        self._check_upload(filename, purpose, size, expires_after_seconds)
        now = int(time.time())
        file_id = ids.file_id()
        key = file_key(file_id)
        stored = await self.store.put_stream(key, stream, size if size is not None else -1)
        public = FileObject(
            id=file_id,
            bytes=stored,
            created_at=now,
            filename=filename,
            purpose=purpose,
            status="processed",
            expires_at=now + expires_after_seconds if expires_after_seconds else None,
        )
        await self.mongo.files.insert_one(file_document(public, project, key))
        return public

    def _check_upload(self, filename: str, purpose: str, size: int | None, expires_after: int | None) -> None:
        if purpose not in PURPOSES:
            raise InvalidRequest(
                f"Invalid purpose {purpose!r}; expected one of {sorted(PURPOSES)}.",
                param="purpose",
                code="invalid_value",
            )
        if purpose == "batch" and not filename.endswith(".jsonl"):
            raise InvalidRequest(
                "A batch input file must be a .jsonl file.",
                param="file",
                code="invalid_file_format",
            )
        limit = self.settings.max_batch_input_bytes if purpose == "batch" else self.settings.max_file_bytes
        if size is not None and size > limit:
            raise PayloadTooLarge(f"The file is {size} bytes; the limit is {limit}.", param="file")
        if expires_after is not None and not MIN_EXPIRY_S <= expires_after <= MAX_EXPIRY_S:
            raise InvalidRequest(
                f"expires_after[seconds] must be between {MIN_EXPIRY_S} and {MAX_EXPIRY_S}.",
                param="expires_after[seconds]",
                code="invalid_value",
            )

    async def document(self, project: str, file_id: str) -> dict[str, Any]:
        """The file's document, as its project sees it: deleted or expired files are not found."""
        doc = await self.mongo.files.find_one({"_id": file_id, "project": project, "deleted": {"$ne": True}})
        if doc is None or (doc.get("expires_at") and doc["expires_at"] <= time.time()):
            raise NotFound(f"No such File object: {file_id}", param="file_id")
        return doc

    async def get(self, project: str, file_id: str) -> FileObject:
        return file_from_document(await self.document(project, file_id))

    async def list_page(
        self, project: str, purpose: str | None, limit: int, order: str, after: str | None
    ) -> ListObject:
        query: dict[str, Any] = {
            "project": project,
            "deleted": {"$ne": True},
            "$and": [{"$or": [{"expires_at": None}, {"expires_at": {"$gt": int(time.time())}}]}],
        }
        if purpose:
            query["purpose"] = purpose
        direction = DESCENDING if order == "desc" else ASCENDING
        if after:
            anchor = await self.document(project, after)
            query["sort_key"] = {"$lt" if order == "desc" else "$gt": anchor.get("sort_key", 0)}
        cursor = self.mongo.files.find(query).sort([("sort_key", direction), ("_id", direction)])
        docs = await cursor.limit(limit + 1).to_list()
        return page([file_from_document(d) for d in docs], limit)

    async def delete(self, project: str, file_id: str) -> None:
        """Delete a file; one a running batch still reads is hidden now and its bytes kept.

        The kept bytes belong to the batch: the aggregator streams the input file again to name
        the lines of a cancelled or expired batch. They go when the last such batch ends
        (``shared/released_files.py``).
        """
        await self.document(project, file_id)  # 404 unless this project sees the file
        # Hidden first, then removed unless an unfinished batch reads it. Whichever comes last,
        # this or the end of that batch, removes it: the same check runs on both sides.
        await self.mongo.files.update_one({"_id": file_id}, {"$set": {"deleted": True}})
        await purge_if_released(self.mongo.files, self.mongo.batches, self.store, file_id)

    async def content(self, project: str, file_id: str) -> AsyncIterator[bytes]:
        doc = await self.document(project, file_id)
        return self.store.iter_chunks(doc["object_key"])


def page(items: list[Any], limit: int) -> ListObject:
    """A list object from up to ``limit + 1`` items (the extra one only says there is more)."""
    data = items[:limit]
    return ListObject(
        data=data,
        has_more=len(items) > limit,
        first_id=data[0].id if data else None,
        last_id=data[-1].id if data else None,
    )
