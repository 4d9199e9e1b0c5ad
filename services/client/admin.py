"""``batchstream keys``: make and revoke API keys in the api's key store (MongoDB) directly.

Why not an endpoint: a key-making endpoint needs a key above all others to guard it; an operator
who can reach the database already holds that power, so the command uses the api's own store
(``shared.api_keys``) with the services' MongoDB settings (``BATCHSTREAM_MONGO_URI``,
``BATCHSTREAM_MONGO_DATABASE``, or the flags). Its dependencies (pymongo, pydantic-settings) come
with the api extra, not the thin client extra; without them the command says what to install.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shared.api_keys import ApiKeyStore, KeyInfo

INSTALL_HINT = (
    "`batchstream keys` writes the api's key store in MongoDB and needs the api's dependencies: "
    "pip install 'batchstream[api]'"
)


class MissingApiExtra(RuntimeError):
    """The key store's dependencies are not installed (the thin client extra only)."""


@asynccontextmanager
async def _key_store(mongo_uri: str | None, database: str | None) -> AsyncIterator[ApiKeyStore]:
    try:
        from shared.api_keys import ApiKeyStore
        from shared.mongo import Mongo
        from shared.settings import MongoSettings
    except ImportError as missing:
        raise MissingApiExtra(f"{INSTALL_HINT} ({missing})") from missing
    overrides: dict[str, Any] = {}
    if mongo_uri:
        overrides["uri"] = mongo_uri
    if database:
        overrides["database"] = database
    mongo = Mongo(MongoSettings(**overrides))
    try:
        yield ApiKeyStore(mongo)
    finally:
        await mongo.close()


def create_key(project: str, mongo_uri: str | None = None, database: str | None = None) -> tuple[str, str]:
    """A new key for ``project``: its id and the plain key, returned once (only its hash is stored)."""

    async def run() -> tuple[str, str]:
        async with _key_store(mongo_uri, database) as store:
            return await store.create(project)

    return asyncio.run(run())


def list_keys(
    project: str | None = None, mongo_uri: str | None = None, database: str | None = None
) -> list[KeyInfo]:
    """Every key made (ids, projects, times; never a key)."""

    async def run() -> list[KeyInfo]:
        async with _key_store(mongo_uri, database) as store:
            return await store.list(project)

    return asyncio.run(run())


def revoke_key(key_or_id: str, mongo_uri: str | None = None, database: str | None = None) -> bool:
    """Revoke a key named by its id or by itself; False when it was never made. Every api replica
    stops taking it within a second."""

    async def run() -> bool:
        async with _key_store(mongo_uri, database) as store:
            return await store.revoke(key_or_id)

    return asyncio.run(run())
