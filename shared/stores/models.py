"""The ``models`` collection as the api reads it (inference workers upsert it as a heartbeat,
``services/inference/heartbeat.py``; document shape in ``shared/documents.py``)."""

from __future__ import annotations

from typing import Any

from pymongo.asynchronous.collection import AsyncCollection

from shared.protocol.openai import ModelCard

Document = dict[str, Any]


def _card(doc: Document) -> ModelCard:
    return ModelCard(
        id=doc["_id"],
        created=int(doc.get("created", 0)),
        max_context_length=doc.get("max_context_length"),
    )


class ModelStore:
    def __init__(self, collection: AsyncCollection[Document]) -> None:
        self._models = collection

    async def cards(self) -> list[ModelCard]:
        return [_card(d) for d in await self._models.find({}).sort("_id").to_list()]

    async def card(self, model_id: str) -> ModelCard | None:
        doc = await self._models.find_one({"_id": model_id})
        return _card(doc) if doc is not None else None

    async def context_lengths(self) -> dict[str, int | None]:
        """Every known model id with its max context length (None when unknown)."""
        cursor = self._models.find({}, {"_id": 1, "max_context_length": 1})
        return {str(m["_id"]): m.get("max_context_length") async for m in cursor}
