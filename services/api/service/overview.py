"""A project's overviews: a batch's progress over time, the models with their workers and queued
lines, and usage per model and day. Reads of batch and model documents, never of the lines."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from shared.errors import NotFound
from shared.protocol.extensions import BatchProgress, ModelStatus, ProgressSample, UsageRow
from shared.stores.batches import BatchStore
from shared.stores.models import ModelStore, card_of, worker_statuses

USAGE_DAYS_DEFAULT, USAGE_DAYS_MAX = 30, 400


class OverviewService:
    def __init__(self, batches: BatchStore, models: ModelStore) -> None:
        self.batches = batches
        self.models = models

    async def progress(self, project: str, batch_id: str) -> BatchProgress:
        found = await self.batches.progress(batch_id, project)
        if found is None:
            raise NotFound.no_such("Batch", batch_id, "batch_id")
        total, samples = found
        return BatchProgress(
            batch_id=batch_id,
            total=total,
            data=[ProgressSample(at=s[0], completed=int(s[1]), failed=int(s[2])) for s in samples],
        )

    async def models_status(self, project: str) -> list[ModelStatus]:
        now = time.time()
        running = await self.batches.running_by_model(project)
        return [
            ModelStatus(
                **card_of(doc).model_dump(),
                workers=worker_statuses(doc, now),
                running_batches=running.get(doc["_id"], (0, 0))[0],
                queued_lines=running.get(doc["_id"], (0, 0))[1],
            )
            for doc in await self.models.documents()
        ]

    async def usage(self, project: str, days: int) -> list[UsageRow]:
        today = int(time.time()) // 86_400 * 86_400
        rows = await self.batches.usage_by_day(project, today - (days - 1) * 86_400)
        return [
            UsageRow(
                day=datetime.fromtimestamp(r["day"], UTC).strftime("%Y-%m-%d"),
                model=r["model"],
                batches=r["batches"],
                completed=r["completed"],
                failed=r["failed"],
                input_tokens=r["input"],
                cached_tokens=r["cached"],
                output_tokens=r["output"],
                total_tokens=r["total"],
            )
            for r in rows
        ]
