"""One active dispatcher per model across api replicas: a lease document in MongoDB.

``{_id: model, owner, expires_at}``. The owner renews it; anyone takes it once it has expired (a
killed replica's lease lapses after ``ttl_s``), and a replica shutting down releases its leases at
once, so a takeover takes one renew period. Two dispatchers may overlap for a moment around a
takeover: both may send a line, and the aggregator counts it once.
"""

from __future__ import annotations

import logging
from typing import Any

from pymongo.asynchronous.collection import AsyncCollection
from pymongo.errors import DuplicateKeyError

log = logging.getLogger(__name__)


class LeaseStore:
    def __init__(self, collection: AsyncCollection[dict[str, Any]], owner: str, ttl_s: float) -> None:
        self._leases = collection
        self.owner = owner
        self.ttl_s = ttl_s

    async def hold(self, model: str, now: float) -> bool:
        """Take or renew the model's lease; False while another live owner holds it."""
        try:
            await self._leases.update_one(
                {"_id": model, "$or": [{"owner": self.owner}, {"expires_at": {"$lt": now}}]},
                {"$set": {"owner": self.owner, "expires_at": now + self.ttl_s}},
                upsert=True,
            )
        except DuplicateKeyError:  # the document exists, held by someone else
            return False
        return True

    async def release(self, models: list[str]) -> None:
        """Let another replica take over at once (clean shutdown)."""
        if models:
            await self._leases.update_many(
                {"_id": {"$in": models}, "owner": self.owner}, {"$set": {"expires_at": 0.0}}
            )

    async def owner_of(self, model: str) -> str | None:
        doc = await self._leases.find_one({"_id": model})
        return None if doc is None else str(doc.get("owner"))
