"""The API keys kept in MongoDB: one owner for the ``api_keys`` collection.

A key is stored only as its SHA-256 hash (``{_id: sha256, project, created_at, revoked?,
revoked_at?}``); the plain key is returned once by ``create`` and never kept. Each key has an id,
``key_`` and the first 20 hex digits of its hash: derived, so every key ever made has one without
a migration, and it reveals nothing of the key (a hash of 256 random bits). An operator lists and
revokes keys by id, so a leaked key is revoked without its plain text. The api resolves presented
keys through ``ApiKeyStore.project_for`` (behind a cache of under a second); ``batchstream keys
create|list|revoke`` writes here directly, so an operator needs database access, not an admin key
the api would have to guard.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import time
from dataclasses import dataclass

from shared.mongo import Mongo

KEY_PREFIX = "sk-bs-"
KEY_ID_PREFIX = "key_"
KEY_ID_DIGITS = 20
KEY_ID = re.compile(rf"^{KEY_ID_PREFIX}[0-9a-f]{{{KEY_ID_DIGITS}}}$")


def key_id(digest: str) -> str:
    """The id of the key hashed to ``digest``."""
    return KEY_ID_PREFIX + digest[:KEY_ID_DIGITS]


@dataclass(frozen=True)
class KeyInfo:
    """What ``keys list`` shows of a key: never the key."""

    id: str
    project: str
    created_at: int
    revoked_at: int | None


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


class ApiKeyStore:
    """Create, revoke and resolve the keys made without a restart."""

    def __init__(self, mongo: Mongo) -> None:
        self.mongo = mongo

    async def create(self, project: str) -> tuple[str, str]:
        """Store a new key for ``project``; returns its id and the plain key (shown once)."""
        key = new_key()
        digest = hash_key(key)
        await self.mongo.api_keys.insert_one(
            {"_id": digest, "project": project, "created_at": int(time.time())}
        )
        return key_id(digest), key

    async def list(self, project: str | None = None) -> list[KeyInfo]:
        """Every key made (revoked ones too), oldest first; only one project's when named."""
        query = {} if project is None else {"project": project}
        found = self.mongo.api_keys.find(query).sort([("created_at", 1), ("_id", 1)])
        return [
            KeyInfo(
                id=key_id(doc["_id"]),
                project=str(doc["project"]),
                created_at=int(doc.get("created_at", 0)),
                revoked_at=int(doc.get("revoked_at") or doc.get("created_at", 0))
                if doc.get("revoked")
                else None,
            )
            async for doc in found
        ]

    async def revoke(self, key_or_id: str) -> bool:
        """Mark a key revoked, named by its id (``key_...``) or by the key itself; False when no
        such key was ever made."""
        text = key_or_id.strip()
        if KEY_ID.match(text):
            hex_part = text.removeprefix(KEY_ID_PREFIX)
            query: dict[str, object] = {"_id": {"$regex": f"^{hex_part}"}}  # a prefix: the index serves it
        else:
            query = {"_id": hash_key(text)}
        update = {"$set": {"revoked": True, "revoked_at": int(time.time())}}
        result = await self.mongo.api_keys.update_one(query, update)
        return result.matched_count == 1

    async def project_for(self, digest: str) -> str | None:
        """The project of the key hashed to ``digest``; None when unknown or revoked."""
        doc = await self.mongo.api_keys.find_one({"_id": digest})
        return str(doc["project"]) if doc and not doc.get("revoked") else None
