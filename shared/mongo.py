"""MongoDB access through PyMongo's async API: one client, named collections, indexes."""

from __future__ import annotations

from typing import Any

from pymongo import ASCENDING, DESCENDING, AsyncMongoClient
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import AutoReconnect, ServerSelectionTimeoutError

from shared.settings import MongoSettings

Document = dict[str, Any]


class Mongo:
    """The database and the collections batchstream keeps."""

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

    @property
    def files(self) -> AsyncCollection[Document]:
        return self.db["files"]

    @property
    def batches(self) -> AsyncCollection[Document]:
        return self.db["batches"]

    @property
    def api_keys(self) -> AsyncCollection[Document]:
        return self.db["api_keys"]

    @property
    def idempotency(self) -> AsyncCollection[Document]:
        return self.db["idempotency"]

    @property
    def models(self) -> AsyncCollection[Document]:
        return self.db["models"]

    @property
    def webhook_events(self) -> AsyncCollection[Document]:
        return self.db["webhook_events"]

    async def ensure_indexes(self) -> None:
        await self.files.create_index([("project", ASCENDING), ("sort_key", DESCENDING)])
        await self.batches.create_index([("project", ASCENDING), ("sort_key", DESCENDING)])
        await self.batches.create_index([("status", ASCENDING)])
        await self.idempotency.create_index([("created_at_date", ASCENDING)], expireAfterSeconds=86_400)
        await self.webhook_events.create_index([("status", ASCENDING), ("next_attempt_at", ASCENDING)])

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
