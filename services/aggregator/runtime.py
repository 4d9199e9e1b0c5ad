"""Clients and the objects the agent, timers and pages share, built once per worker.

Built when the worker starts (``worker.py``), never at import, and closed when it stops.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import MutableMapping
from typing import Any

from services.aggregator.counting import ChunkProcessor, ChunkWriter, CountsFlusher
from services.aggregator.finalize import Finalizer, FinalizeScheduler
from services.aggregator.settings import AggregatorConfig
from services.aggregator.webhooks import WebhookDeliverer
from shared.kafka import key_partition
from shared.mongo import Mongo
from shared.settings import MongoSettings, StorageSettings, WebhookSettings
from shared.storage import ObjectStore
from shared.stores.batch_progress import BatchDirectory, BatchProgressStore
from shared.stores.batches import BatchStore
from shared.stores.files import FileStore
from shared.stores.webhooks import WebhookEventStore
from shared.webhooks import EventRecorder

log = logging.getLogger(__name__)


def partition_for(batch_id: str, partitions: int) -> int:
    """The results partition of a batch (the producers key results by batch id)."""
    return key_partition(batch_id.encode(), partitions)


class Runtime:
    def __init__(self, config: AggregatorConfig, states: MutableMapping[str, Any]) -> None:
        self.config = config
        self.mongo = Mongo(MongoSettings())
        self.store = ObjectStore(StorageSettings())
        self.webhook_settings = WebhookSettings()
        webhook_events = WebhookEventStore(self.mongo.webhook_events)
        recorder = EventRecorder(webhook_events, self.webhook_settings.endpoints)
        self.webhooks = WebhookDeliverer(webhook_events, self.webhook_settings)
        # Every batch end this store moves records its webhook event.
        self.batches = BatchStore(self.mongo.batches, recorder)
        progress = BatchProgressStore(self.mongo.batches)
        self.directory = BatchDirectory(self.batches, progress, config.batch_cache_size)
        self.counts = CountsFlusher(progress, states)
        self.finalizer = Finalizer(
            config,
            batches=self.batches,
            files=FileStore(self.mongo.files),
            store=self.store,
            states=states,
            directory=self.directory,
        )
        self.scheduler = FinalizeScheduler(self.finalizer, config.finalize_concurrency)
        self.processor = ChunkProcessor(
            config,
            states=states,
            directory=self.directory,
            writer=ChunkWriter(self.store),
            counts=self.counts,
            finalize=self.scheduler,
        )

    async def record_missed_ends(self, limit: int = 100) -> int:
        """Record the events of batches ended by a process killed before it recorded them
        (``BatchStore.unrecorded_ends``); returns how many."""
        cutoff = time.time() - self.webhook_settings.missed_end_after_s
        missed = await self.batches.unrecorded_ends(cutoff, limit)
        for batch in missed:
            await self.batches.announce_end(batch)
        if missed:
            log.warning("recorded missed batch ends", extra={"batch_ids": [b.id for b in missed]})
        return len(missed)

    async def healthy(self) -> bool:
        try:
            await asyncio.wait_for(asyncio.gather(self.mongo.ping(), self.store.ping()), 3.0)
        except Exception:
            log.warning("a dependency is down", exc_info=True)
            return False
        return True

    async def drain(self) -> None:
        """Finish what can finish and write the last counts (while the producer still runs)."""
        await self.scheduler.drain(timeout_s=10.0)
        try:
            await self.counts.flush()
        except Exception:
            log.warning("last counts flush failed", exc_info=True)

    async def close(self) -> None:
        await self.webhooks.close()
        await self.mongo.close()
        self.store.close()
