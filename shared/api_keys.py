"""The API keys kept in MongoDB: one owner for the ``api_keys`` collection.

A key is stored only as its SHA-256 hash (``{_id: sha256, project, created_at, revoked?}``); the
plain key is returned once by ``create`` and never kept. The api resolves presented keys through
``ApiKeyStore.project_for`` (behind its cache); ``batchstream keys create|revoke`` writes here
directly, so an operator needs database access, not an admin key the api would have to guard.
"""

from __future__ import annotations

import hashlib
import secrets
import time

from shared.mongo import Mongo

KEY_PREFIX = "sk-bs-"


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


class ApiKeyStore:
    """Create, revoke and resolve the keys made without a restart."""

    def __init__(self, mongo: Mongo) -> None:
        self.mongo = mongo

    async def create(self, project: str) -> str:
        """Store a new key for ``project``; returns the plain key (shown once)."""
        key = new_key()
        await self.mongo.api_keys.insert_one(
            {"_id": hash_key(key), "project": project, "created_at": int(time.time())}
        )
        return key

    async def revoke(self, key: str) -> bool:
        """Mark ``key`` revoked; False when no such key was ever made."""
        result = await self.mongo.api_keys.update_one({"_id": hash_key(key)}, {"$set": {"revoked": True}})
        return result.matched_count == 1

    async def project_for(self, digest: str) -> str | None:
        """The project of the key hashed to ``digest``; None when unknown or revoked."""
        doc = await self.mongo.api_keys.find_one({"_id": digest})
        return str(doc["project"]) if doc and not doc.get("revoked") else None
