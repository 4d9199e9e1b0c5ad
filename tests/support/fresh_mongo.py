"""A database of a test module's own on a running MongoDB, dropped when the module is done."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from deploy.local import Stack
from shared.mongo import Mongo
from shared.settings import MongoSettings


@asynccontextmanager
async def fresh_mongo(stack: Stack, prefix: str) -> AsyncIterator[Mongo]:
    """``Mongo`` on a new database ``<prefix>_<random>`` of ``stack``'s server; dropped on exit."""
    database = f"{prefix}_{uuid.uuid4().hex[:8]}"
    mongo = Mongo(MongoSettings(uri=stack.env()["BATCHSTREAM_MONGO_URI"], database=database))
    try:
        yield mongo
    finally:
        await mongo.client.drop_database(database)
        await mongo.close()
