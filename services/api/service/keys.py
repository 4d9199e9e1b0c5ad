"""API keys: stored as SHA-256 hashes, each mapping to the project that owns what it creates.

Keys come from two places: ``BATCHSTREAM_API_KEYS`` (``key=project,...``; hashed at start-up and the
plain text dropped) and the MongoDB ``api_keys`` collection (``{_id: sha256, project, created_at}``),
filled by ``python -m services.api.keys create --project NAME``, which prints the key once.
"""

from __future__ import annotations

import hashlib
import secrets
import time

from shared.mongo import Mongo

KEY_PREFIX = "sk-bs-"
CACHE_TTL_S = 30.0


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


class KeyRing:
    """Resolves a presented key to its project; the database is asked at most once per TTL."""

    def __init__(self, mongo: Mongo, configured: dict[str, str]) -> None:
        self.mongo = mongo
        self._static = {hash_key(k): project for k, project in configured.items()}
        self._cache: dict[str, tuple[str | None, float]] = {}

    async def project_for(self, key: str) -> str | None:
        digest = hash_key(key)
        if digest in self._static:
            return self._static[digest]
        cached = self._cache.get(digest)
        if cached and cached[1] > time.monotonic():
            return cached[0]
        doc = await self.mongo.api_keys.find_one({"_id": digest})
        project = str(doc["project"]) if doc and not doc.get("revoked") else None
        if len(self._cache) > 10_000:
            self._cache.clear()
        self._cache[digest] = (project, time.monotonic() + CACHE_TTL_S)
        return project

    async def create(self, project: str) -> str:
        key = new_key()
        await self.mongo.api_keys.insert_one(
            {"_id": hash_key(key), "project": project, "created_at": int(time.time())}
        )
        return key

    async def revoke(self, key: str) -> bool:
        result = await self.mongo.api_keys.update_one({"_id": hash_key(key)}, {"$set": {"revoked": True}})
        return result.matched_count == 1
