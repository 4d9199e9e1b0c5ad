"""The worker's entry in the ``models`` collection, refreshed as a heartbeat.

The api lists every model a worker has announced (validation accepts its lines even while no
worker runs: they wait on Kafka); each worker's ``last_seen`` tells the console and operators
which workers are alive. One upsert every few seconds per worker: never per request line.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket

from pymongo.errors import PyMongoError

from services.inference.engine import Engine
from shared.mongo import Mongo
from shared.stores.models import HEARTBEAT_INTERVAL_S, ModelStore

log = logging.getLogger(__name__)


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


async def beat(mongo: Mongo, engine: Engine, worker: str | None = None) -> None:
    await ModelStore(mongo.models).beat(
        engine.model_id,
        worker or worker_name(),
        engine.max_context_length,
        list(engine.endpoints),
        adapters=list(engine.adapters),
    )


async def heartbeat_forever(mongo: Mongo, engine: Engine, interval_s: float = HEARTBEAT_INTERVAL_S) -> None:
    """Upsert the model document every ``interval_s``; a database outage only logs."""
    worker = worker_name()
    while True:
        try:
            await beat(mongo, engine, worker)
        except PyMongoError as exc:
            log.warning("model heartbeat failed: %s", exc, extra={"model": engine.model_id})
        await asyncio.sleep(interval_s)
