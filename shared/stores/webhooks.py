"""The ``webhook_events`` collection: the outbox of batch events (``shared/webhooks.py``).

Document shape: :class:`shared.documents.WebhookEventDocument`. An attempt is claimed with one
conditional update (pending, due, lease expired) that sets a fresh lease token, so two
deliverers never send the same attempt at once; the outcome is written only by the token holder.
"""

from __future__ import annotations

import secrets
from typing import Any

from pymongo import ReturnDocument
from pymongo.asynchronous.collection import AsyncCollection

from shared.documents import WebhookEventDocument

Document = dict[str, Any]


class WebhookEventStore:
    def __init__(self, collection: AsyncCollection[Document]) -> None:
        self._events = collection

    async def record(self, event: WebhookEventDocument) -> None:
        """Insert the event unless it is already recorded (a repeated record changes nothing)."""
        fields = event.to_mongo()
        del fields["_id"]
        await self._events.update_one({"_id": event.id}, {"$setOnInsert": fields}, upsert=True)

    async def get(self, event_id: str) -> WebhookEventDocument | None:
        doc = await self._events.find_one({"_id": event_id})
        return WebhookEventDocument.model_validate(doc) if doc is not None else None

    async def claim(self, now: float, lease_s: float) -> WebhookEventDocument | None:
        """Take one due event for an attempt (counted); None when none is due."""
        doc = await self._events.find_one_and_update(
            {"status": "pending", "next_attempt_at": {"$lte": now}, "lease_until": {"$lte": now}},
            {
                "$set": {"lease_until": now + lease_s, "lease_token": secrets.token_hex(8)},
                "$inc": {"attempts": 1},
            },
            return_document=ReturnDocument.AFTER,
        )
        return WebhookEventDocument.model_validate(doc) if doc is not None else None

    async def delivered(self, event: WebhookEventDocument, now: float) -> None:
        await self._settle(event, {"status": "delivered", "delivered_at": now, "last_error": None})

    async def retry_at(self, event: WebhookEventDocument, when: float, error: str) -> None:
        await self._settle(event, {"next_attempt_at": when, "last_error": error})

    async def give_up(self, event: WebhookEventDocument, error: str) -> None:
        await self._settle(event, {"status": "failed", "last_error": error})

    async def pending(self) -> int:
        """Events not yet delivered nor given up (the queue)."""
        return await self._events.count_documents({"status": "pending"})

    async def _settle(self, event: WebhookEventDocument, fields: Document) -> None:
        await self._events.update_one(
            {"_id": event.id, "lease_token": event.lease_token}, {"$set": {**fields, "lease_until": 0.0}}
        )
