"""The ``files`` collection: every read and write of a file document goes through here."""

from __future__ import annotations

import time
from typing import Any

from pymongo import ASCENDING, DESCENDING
from pymongo.asynchronous.collection import AsyncCollection

from shared.documents import FileDocument

Document = dict[str, Any]


class FileStore:
    def __init__(self, collection: AsyncCollection[Document]) -> None:
        self._files = collection

    async def insert(self, file: FileDocument) -> None:
        await self._files.insert_one(file.to_mongo())

    async def upsert(self, file: FileDocument) -> None:
        """Write a file whose id is deterministic (a batch's output): ``created_at`` and ``deleted``
        kept from the first write, everything else replaced, so a re-run leaves one document."""
        doc = file.to_mongo()
        doc.pop("_id")
        first_write = {"created_at": doc.pop("created_at"), "deleted": doc.pop("deleted")}
        await self._files.update_one(
            {"_id": file.id}, {"$set": doc, "$setOnInsert": first_write}, upsert=True
        )

    async def object_keys(self, file_ids: list[str]) -> dict[str, str]:
        """Where the bytes of these files are (file id -> object key)."""
        found = self._files.find({"_id": {"$in": file_ids}}, {"object_key": 1})
        return {str(d["_id"]): str(d["object_key"]) async for d in found}

    async def get(self, file_id: str) -> FileDocument | None:
        """The file whatever its state (deleted and expired included)."""
        doc = await self._files.find_one({"_id": file_id})
        return FileDocument.model_validate(doc) if doc is not None else None

    async def visible(self, project: str, file_id: str) -> FileDocument | None:
        """The file as its project sees it: None when deleted, expired or another project's."""
        doc = await self._files.find_one({"_id": file_id, "project": project, "deleted": {"$ne": True}})
        if doc is None or (doc.get("expires_at") and doc["expires_at"] <= time.time()):
            return None
        return FileDocument.model_validate(doc)

    async def page(
        self,
        project: str,
        purpose: str | None,
        limit: int,
        descending: bool,
        after_sort_key: int | None,
    ) -> list[FileDocument]:
        """Up to ``limit`` visible files of the project, in creation order, past the anchor if given."""
        query: Document = {
            "project": project,
            "deleted": {"$ne": True},
            "$and": [{"$or": [{"expires_at": None}, {"expires_at": {"$gt": int(time.time())}}]}],
        }
        if purpose:
            query["purpose"] = purpose
        if after_sort_key is not None:
            query["sort_key"] = {"$lt" if descending else "$gt": after_sort_key}
        direction = DESCENDING if descending else ASCENDING
        cursor = self._files.find(query).sort([("sort_key", direction), ("_id", direction)])
        return [FileDocument.model_validate(d) for d in await cursor.limit(limit).to_list()]

    async def stored_bytes(self, project: str) -> int:
        """Bytes of the project's visible files (not deleted, not expired): its stored-bytes use."""
        match = {
            "project": project,
            "deleted": {"$ne": True},
            "$or": [{"expires_at": None}, {"expires_at": {"$gt": int(time.time())}}],
        }
        stages: list[Document] = [{"$match": match}, {"$group": {"_id": None, "bytes": {"$sum": "$bytes"}}}]
        rows = await (await self._files.aggregate(stages)).to_list()
        return int(rows[0]["bytes"]) if rows else 0

    async def hide(self, file_id: str) -> None:
        """Mark deleted: the file is gone for its project; the bytes may still be kept."""
        await self._files.update_one({"_id": file_id}, {"$set": {"deleted": True}})

    async def hidden(self, file_id: str) -> FileDocument | None:
        doc = await self._files.find_one({"_id": file_id, "deleted": True})
        return FileDocument.model_validate(doc) if doc is not None else None

    async def remove_hidden(self, file_id: str) -> None:
        await self._files.delete_one({"_id": file_id, "deleted": True})
