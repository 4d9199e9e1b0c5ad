"""The batches collection as the Message Batches API reads it: a project's message batches paged
both ways, and the delete of one that ended. Every other read and write of a message batch is
the batch store's (shared/stores/batches.py): a message batch is a batch."""

from __future__ import annotations

from typing import Any

from pymongo import ASCENDING, DESCENDING
from pymongo.asynchronous.collection import AsyncCollection

from shared import lifecycle
from shared.documents import BatchDocument
from shared.protocol.anthropic import ANTHROPIC_API

Document = dict[str, Any]


class MessageBatchStore:
    def __init__(self, collection: AsyncCollection[Document]) -> None:
        self._batches = collection

    async def page(
        self, project: str, limit: int, *, older_than: int | None = None, newer_than: int | None = None
    ) -> list[BatchDocument]:
        """Up to ``limit`` of the project's message batches, newest first: those created before
        the ``older_than`` sort key, or the ones just after ``newer_than`` (the nearest ones)."""
        query: Document = {"project": project, "api": ANTHROPIC_API}
        order = DESCENDING
        if older_than is not None:
            query["sort_key"] = {"$lt": older_than}
        elif newer_than is not None:
            query["sort_key"] = {"$gt": newer_than}
            order = ASCENDING
        cursor = self._batches.find(query, {"progress": 0, "seen_lines": 0})
        cursor = cursor.sort([("sort_key", order), ("_id", order)]).limit(limit)
        docs = [BatchDocument.model_validate(d) for d in await cursor.to_list()]
        return docs if order == DESCENDING else docs[::-1]

    async def delete_ended(self, batch_id: str, project: str) -> bool:
        """Remove a message batch that ended and whose end event is recorded (its webhook); False
        when there is none such (not found, another project's, or still processing)."""
        query = {
            "_id": batch_id,
            "project": project,
            "api": ANTHROPIC_API,
            "status": {"$in": sorted(lifecycle.TERMINAL)},
            "end_recorded": {"$ne": False},
        }
        return (await self._batches.delete_one(query)).deleted_count == 1
