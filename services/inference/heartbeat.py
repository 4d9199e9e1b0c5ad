"""The worker's entry in the ``models`` collection, refreshed as a heartbeat.

The api lists every model a worker has announced (validation accepts its lines even while no
worker runs: they wait on Kafka); ``last_seen`` tells operators when one was last alive.
One upsert every few seconds per worker: never per request line.
"""

from __future__ import annotations

import asyncio
import logging
import time

from pymongo.errors import PyMongoError

from services.inference.engine import Engine
from shared.mongo import Mongo

log = logging.getLogger(__name__)

HEARTBEAT_INTERVAL_S = 10.0


async def beat(mongo: Mongo, engine: Engine) -> None:
    now = time.time()
    await mongo.models.update_one(
        {"_id": engine.model_id},
        {
            "$set": {
                "max_context_length": engine.max_context_length,
                "endpoints": list(engine.endpoints),
                "last_seen": now,
            },
            "$setOnInsert": {"created": int(now)},
        },
        upsert=True,
    )


async def heartbeat_forever(mongo: Mongo, engine: Engine, interval_s: float = HEARTBEAT_INTERVAL_S) -> None:
    """Upsert the model document every ``interval_s``; a database outage only logs."""
    while True:
        try:
            await beat(mongo, engine)
        except PyMongoError as exc:
            log.warning("model heartbeat failed: %s", exc, extra={"model": engine.model_id})
        await asyncio.sleep(interval_s)
