"""MongoDB access through PyMongo's async API: one client, and the registry of every collection
batchstream keeps with the indexes its queries need.

Every service reaches a collection through :class:`Mongo`'s named properties, each built from
the registry below; none spells a collection's name. :meth:`Mongo.ensure_indexes` (the api's
start) creates every registered index. Every collection has MongoDB's own ``_id`` index; an entry
lists only what a query filtering or sorting on another field needs, and says why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pymongo import ASCENDING, DESCENDING, AsyncMongoClient, IndexModel
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import AutoReconnect, ServerSelectionTimeoutError

from shared.settings import MongoSettings

Document = dict[str, Any]


@dataclass(frozen=True)
class Collection:
    """A collection and the indexes it needs beyond ``_id``."""

    name: str
    indexes: tuple[IndexModel, ...] = ()


# Newest-first pages of a project's files (FileStore.page).
FILES = Collection("files", (IndexModel([("project", ASCENDING), ("sort_key", DESCENDING)]),))
BATCHES = Collection(
    "batches",
    (
        # Newest-first pages of a project's batches (BatchStore.page).
        IndexModel([("project", ASCENDING), ("sort_key", DESCENDING)]),
        # The same filtered by status (``GET /v1/batches?status=``, the console's refresh).
        IndexModel([("project", ASCENDING), ("status", ASCENDING), ("sort_key", DESCENDING)]),
        # A project's message batches, paged both ways (MessageBatchStore.page).
        IndexModel([("project", ASCENDING), ("api", ASCENDING), ("sort_key", DESCENDING)]),
        # The dispatch queue, the expiry sweep, the in-progress and unfinished-work scans.
        IndexModel([("status", ASCENDING)]),
    ),
)
# Looked up by _id only (the sha256 of the key).
API_KEYS = Collection("api_keys")
# A claimed create slot, looked up by _id; MongoDB removes it a day after it was claimed.
IDEMPOTENCY = Collection(
    "idempotency", (IndexModel([("created_at_date", ASCENDING)], expireAfterSeconds=86_400),)
)
# One document per model (the workers' heartbeat), read whole or by _id.
MODELS = Collection("models")
# The deliverer's claim of the next due pending event (WebhookEventStore.claim).
WEBHOOK_EVENTS = Collection(
    "webhook_events", (IndexModel([("status", ASCENDING), ("next_attempt_at", ASCENDING)]),)
)
# One lease per model, every query by _id (the owner and expiry filters narrow that one
# document). No TTL index: ``expires_at`` is epoch seconds, not a date, and a lapsed lease is
# taken over in place rather than removed.
DISPATCH_LEASES = Collection("dispatch_leases")
# One read position per dispatched batch, every query by _id (``line`` only guards the write
# of that one document). No TTL index: the document holds no date to expire it by.
DISPATCH_POSITIONS = Collection("dispatch_positions")

COLLECTIONS = (
    FILES,
    BATCHES,
    API_KEYS,
    IDEMPOTENCY,
    MODELS,
    WEBHOOK_EVENTS,
    DISPATCH_LEASES,
    DISPATCH_POSITIONS,
)


class Mongo:
    """The database and the registered collections."""

    def __init__(self, settings: MongoSettings, *, timeout_s: float | None = None) -> None:
        """``timeout_s`` bounds every operation (pymongo's timeoutMS) for a caller someone waits on:
        without it a MongoDB that stops answering on an open connection hangs a call for good."""
        options: dict[str, Any] = {"timeoutMS": int(timeout_s * 1000)} if timeout_s else {}
        self.client: AsyncMongoClient[Document] = AsyncMongoClient(
            settings.uri,
            serverSelectionTimeoutMS=5000,
            tz_aware=False,
            journal=settings.journal,
            **options,
        )
        self.db: AsyncDatabase[Document] = self.client[settings.database]

    def collection(self, registered: Collection) -> AsyncCollection[Document]:
        return self.db[registered.name]

    @property
    def files(self) -> AsyncCollection[Document]:
        return self.collection(FILES)

    @property
    def batches(self) -> AsyncCollection[Document]:
        return self.collection(BATCHES)

    @property
    def api_keys(self) -> AsyncCollection[Document]:
        return self.collection(API_KEYS)

    @property
    def idempotency(self) -> AsyncCollection[Document]:
        return self.collection(IDEMPOTENCY)

    @property
    def models(self) -> AsyncCollection[Document]:
        return self.collection(MODELS)

    @property
    def webhook_events(self) -> AsyncCollection[Document]:
        return self.collection(WEBHOOK_EVENTS)

    @property
    def dispatch_leases(self) -> AsyncCollection[Document]:
        return self.collection(DISPATCH_LEASES)

    @property
    def dispatch_positions(self) -> AsyncCollection[Document]:
        return self.collection(DISPATCH_POSITIONS)

    async def ensure_indexes(self) -> None:
        """Create every registered index (a no-op for one that exists with the same keys)."""
        for registered in COLLECTIONS:
            if registered.indexes:
                await self.collection(registered).create_indexes(list(registered.indexes))

    async def ping(self) -> None:
        """Ask the server; a pooled connection found closed (the server dropped it while idle,
        or restarted) is retried once: PyMongo has cleared the pool, so the retry opens a fresh
        connection. Without the retry a health probe after a quiet spell flapped to 503."""
        try:
            await self.client.admin.command("ping")
        except ServerSelectionTimeoutError:
            raise  # no server to reach: down, not stale
        except AutoReconnect:
            await self.client.admin.command("ping")

    async def close(self) -> None:
        await self.client.close()
