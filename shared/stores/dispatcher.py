"""The api dispatcher's stored state: its queue in the ``batches`` collection, each batch's
position in ``dispatch_positions``, each model's lease in ``dispatch_leases``.

**The queue.** What the dispatcher reads of each validated batch (``DispatchView``), and what it
writes back (every line sent, every sent line answered). The batch's records and its status
changes are ``shared/stores/batches.py``'s; this store reads and writes only the dispatcher's
fields.

**Positions.** Where each batch's input has been dispatched up to, persisted so a new
dispatcher resumes there: ``{_id: batch_id, line, byte, sent}``; ``line``/``byte`` name the next
input line not yet on Kafka (for a batch in prefix order: the next entry of its order), ``sent``
counts request lines dispatched. That every line went is the batch document's ``emitted`` (its one
record; ``Position.done`` is its copy in memory). A position is written only after its lines were
acknowledged by the broker, and only forwards (a stale dispatcher cannot move it back). A resumed
batch sends again at most the lines dispatched since the last write; the aggregator counts a line
once. Written at most once per ``position_flush_s`` per batch: never per line.

**Leases.** One active dispatcher per model across api replicas: ``{_id: model, owner,
expires_at}``. The owner renews it; anyone takes it once it has expired (a killed replica's lease
lapses after ``ttl_s``), and a replica shutting down releases its leases at once, so a takeover
takes one renew period. Two dispatchers may overlap for a moment around a takeover: both may send
a line, and the aggregator counts it once.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from pymongo import UpdateOne
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.errors import BulkWriteError, DuplicateKeyError

from shared import lifecycle
from shared.seen_lines import SeenLines

Document = dict[str, Any]
DUPLICATE_KEY = 11000  # MongoDB's error code for a unique index (``_id``) collision


# The batch document's fields the api's dispatcher reads (``DispatchView``).
DISPATCH_FIELDS = {
    "model": 1,
    "project": 1,
    "status": 1,
    "priority": 1,
    "prefix_order": 1,
    "expires_at": 1,
    "sort_key": 1,
    "input_file_id": 1,
    "defaults": 1,
    "request_counts.total": 1,
    "emitted": 1,
    "resumed": 1,
    "parts": 1,
    "emitted_parts": 1,
    "mixed_models": 1,
}


def dispatch_unit(batch_id: str, part: int | None) -> str:
    """What the dispatcher sends and positions as one: the batch, or one part of a mixed batch."""
    return batch_id if part is None else f"{batch_id}#{part}"


@dataclass(frozen=True)
class DispatchView:
    """What the api's dispatcher reads of a batch it may dispatch (``DISPATCH_FIELDS``)."""

    batch_id: str
    model: str | None
    project: str
    status: str
    priority: int
    prefix_order: bool  # sent in its dispatch order (services/api/service/dispatch_order.py)
    expires_at: float  # infinity when the batch has no deadline
    sort_key: int
    input_file_id: str
    defaults: Document
    total: int
    emitted: bool  # every line was sent
    resumed: bool  # run again after a broker loss: lines with a result (seen_lines) are not sent
    part: int | None = None  # a mixed batch's part (the lines of ``model``), or None: every line
    parts: int = 1  # how many parts the batch has

    @property
    def unit(self) -> str:
        return dispatch_unit(self.batch_id, self.part)

    @classmethod
    def of_document(cls, doc: Document) -> list[DispatchView]:
        """The batch's view, or one per part of a mixed batch (``shared/documents.py``)."""
        view = cls.from_document(doc)
        parts = doc.get("parts")
        if not doc.get("mixed_models") or not parts:
            if parts:  # one model: its base model's workers run it (an adapter's lines too)
                return [replace(view, model=parts[0].get("model") or view.model)]
            return [view]
        emitted, n = set(doc.get("emitted_parts") or ()), len(parts)
        return [
            replace(view, model=p.get("model"), total=int(p["lines"]), part=i, parts=n, emitted=i in emitted)
            for i, p in enumerate(parts)
        ]

    @classmethod
    def from_document(cls, doc: Document) -> DispatchView:
        expires_at = doc.get("expires_at")
        return cls(
            batch_id=str(doc["_id"]),
            model=doc.get("model"),
            project=str(doc.get("project") or "default"),
            status=str(doc["status"]),
            priority=int(doc.get("priority") or 0),
            prefix_order=bool(doc.get("prefix_order")),
            expires_at=float(expires_at) if expires_at is not None else float("inf"),
            sort_key=int(doc.get("sort_key") or 0),
            input_file_id=str(doc.get("input_file_id") or ""),
            defaults=dict(doc.get("defaults") or {}),
            total=int((doc.get("request_counts") or {}).get("total") or 0),
            emitted=bool(doc.get("emitted")),
            resumed=bool(doc.get("resumed")),
        )


class DispatchQueueStore:
    """The dispatcher's reads and writes of the ``batches`` collection."""

    def __init__(self, collection: AsyncCollection[Document]) -> None:
        self._batches = collection

    async def views(self) -> list[DispatchView]:
        """What the api's dispatcher reads of every validated batch still running or cancelling."""
        query = {"dispatchable": True, "status": {"$in": sorted(lifecycle.DISPATCHING)}}
        found = self._batches.find(query, DISPATCH_FIELDS)
        return [view async for doc in found for view in DispatchView.of_document(doc)]

    async def mark_emitted(self, batch_id: str, part: int | None = None, parts: int = 1) -> None:
        """The dispatcher has published every line of the batch (of one of its ``parts``)."""
        if part is None:
            await self._batches.update_one({"_id": batch_id}, {"$set": {"emitted": True}})
            return
        await self._batches.update_one({"_id": batch_id}, {"$addToSet": {"emitted_parts": part}})
        every = {"_id": batch_id, f"emitted_parts.{parts - 1}": {"$exists": True}}
        await self._batches.update_one(every, {"$set": {"emitted": True}})

    async def settle_dispatch(self, batch_id: str, part: int | None = None, parts: int = 1) -> None:
        """A cancelling batch whose every dispatched line came back (of each of its ``parts``):
        the aggregator may end it."""
        if part is not None:
            await self._batches.update_one({"_id": batch_id}, {"$addToSet": {"settled_parts": part}})
        every: Document = {"_id": batch_id, "status": "cancelling"}
        if part is not None:
            every[f"settled_parts.{parts - 1}"] = {"$exists": True}
        await self._batches.update_one(every, {"$set": {"dispatch_settled": True}})

    async def seen_lines(self, batch_ids: Iterable[str]) -> dict[str, SeenLines]:
        """The aggregator's seen-lines bitmaps of these batches, as last flushed."""
        found = self._batches.find({"_id": {"$in": list(batch_ids)}}, {"seen_lines": 1})
        return {str(d["_id"]): SeenLines.from_compressed(d.get("seen_lines")) async for d in found}


# ------------------------------------------------------------------------------------ positions


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

    async def save(self, positions: dict[str, Position]) -> None:
        """Store these batches' positions in one request; a position stored further already is
        kept (its upsert collides with the document and is skipped)."""
        if not positions:
            return
        updates = [
            UpdateOne(
                {"_id": batch_id, "line": {"$lt": p.line}},
                {"$set": {"line": p.line, "byte": p.byte, "sent": p.sent}},
                upsert=True,
            )
            for batch_id, p in positions.items()
        ]
        try:
            await self._positions.bulk_write(updates, ordered=False)
        except BulkWriteError as exc:
            details = exc.details
            if details.get("writeConcernErrors") or any(
                e.get("code") != DUPLICATE_KEY for e in details.get("writeErrors", [])
            ):
                raise

    async def forget(self, batch_ids: list[str]) -> None:
        if batch_ids:
            await self._positions.delete_many({"_id": {"$in": batch_ids}})


# --------------------------------------------------------------------------------------- leases


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
