"""Where each batch's input has been dispatched up to, persisted so a new dispatcher resumes there.

``dispatch_positions``: ``{_id: batch_id, line, byte, sent}``: ``line``/``byte`` name the next
input line not yet on Kafka (for a batch in prefix order: the next entry of its order), ``sent``
counts request lines dispatched. That every line went is the batch document's ``emitted`` (its one
record; ``Position.done`` is its copy in memory). A position is written only after its lines were
acknowledged by the broker, and only
forwards (a stale dispatcher cannot move it back). A resumed batch sends again at most the lines
dispatched since the last write; the aggregator counts a line once. Written at most once per
``position_flush_s`` per batch: never per line.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pymongo.asynchronous.collection import AsyncCollection
from pymongo.errors import DuplicateKeyError


@dataclass
class Position:
    line: int = 1
    byte: int = 0
    sent: int = 0
    done: bool = False  # every line sent: the batch's ``emitted``, not stored here

    @classmethod
    def from_document(cls, doc: dict[str, Any] | None, done: bool = False) -> Position:
        if not doc:
            return cls(done=done)
        return cls(int(doc["line"]), int(doc["byte"]), int(doc.get("sent", 0)), done)


class PositionStore:
    def __init__(self, collection: AsyncCollection[dict[str, Any]]) -> None:
        self._positions = collection

    async def load(self, batch_ids: list[str]) -> dict[str, dict[str, Any]]:
        """The stored positions of these batches (``Position.from_document`` reads one)."""
        found = self._positions.find({"_id": {"$in": batch_ids}})
        return {doc["_id"]: doc async for doc in found}

    async def save(self, batch_id: str, position: Position) -> None:
        stored = {"line": position.line, "byte": position.byte, "sent": position.sent}
        try:
            await self._positions.update_one(
                {"_id": batch_id, "line": {"$lt": position.line}}, {"$set": stored}, upsert=True
            )
        except DuplicateKeyError:  # already as far or further: keep it
            pass

    async def forget(self, batch_ids: list[str]) -> None:
        if batch_ids:
            await self._positions.delete_many({"_id": {"$in": batch_ids}})
