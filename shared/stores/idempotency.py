"""The ``idempotency`` collection: create slots that make a retried create return the same batch.

A slot is ``{_id: slot, batch_id, fingerprint, created_at, created_at_date}``; MongoDB's TTL index
on ``created_at_date`` removes it after a day (``shared/mongo.py``).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.errors import DuplicateKeyError

Document = dict[str, Any]


class Claim(BaseModel):
    slot: str
    batch_id: str
    fingerprint: str
    created_at: float

    def to_mongo(self) -> Document:
        return {
            "_id": self.slot,
            "batch_id": self.batch_id,
            "fingerprint": self.fingerprint,
            "created_at": self.created_at,
            "created_at_date": datetime.fromtimestamp(self.created_at, UTC),
        }


class IdempotencyStore:
    def __init__(self, collection: AsyncCollection[Document]) -> None:
        self._claims = collection

    async def claim(self, claim: Claim) -> bool:
        """Take the slot; False when it is already held."""
        try:
            await self._claims.insert_one(claim.to_mongo())
            return True
        except DuplicateKeyError:
            return False

    async def held(self, slot: str) -> Claim | None:
        doc = await self._claims.find_one({"_id": slot})
        if doc is None:
            return None
        return Claim(
            slot=slot,
            batch_id=doc["batch_id"],
            fingerprint=doc["fingerprint"],
            created_at=doc["created_at"],
        )

    async def release(self, slot: str, batch_id: str) -> None:
        """Free the slot if ``batch_id`` still holds it."""
        await self._claims.delete_one({"_id": slot, "batch_id": batch_id})

    async def take_over(self, stale: Claim, claim: Claim) -> None:
        """Replace a stale claim (only if it is still the one read)."""
        await self._claims.replace_one({"_id": stale.slot, "created_at": stale.created_at}, claim.to_mongo())
