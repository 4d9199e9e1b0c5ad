"""API keys resolved to the project that owns what they create, behind a short cache.

Keys come from two places: ``BATCHSTREAM_API_KEYS`` (``key=project,...``; hashed at start-up and the
plain text dropped) and MongoDB through ``shared.api_keys.ApiKeyStore``, filled by
``batchstream keys create --project NAME``, which prints the key once. A key revoked there
(``batchstream keys revoke ID``) is refused by every api replica within ``CACHE_TTL_S``: a
replica asks the database about a key at most every half second (one small read per key in use,
per replica).
"""

from __future__ import annotations

import time

from shared.api_keys import ApiKeyStore, hash_key
from shared.mongo import Mongo

CACHE_TTL_S = 0.5


class KeyRing:
    """Resolves a presented key to its project; the database is asked at most once per TTL."""

    def __init__(self, mongo: Mongo, configured: dict[str, str]) -> None:
        self.store = ApiKeyStore(mongo)
        self._static = {hash_key(k): project for k, project in configured.items()}
        self._cache: dict[str, tuple[str | None, float]] = {}

    async def project_for(self, key: str) -> str | None:
        digest = hash_key(key)
        if digest in self._static:
            return self._static[digest]
        cached = self._cache.get(digest)
        if cached and cached[1] > time.monotonic():
            return cached[0]
        project = await self.store.project_for(digest)
        if len(self._cache) > 10_000:
            self._cache.clear()
        self._cache[digest] = (project, time.monotonic() + CACHE_TTL_S)
        return project
