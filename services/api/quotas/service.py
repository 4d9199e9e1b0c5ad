"""The quota checks the api runs (upload, create, validation) and the project's usage view.

Where a check and the count it guards race:
- a create is inserted, then the project's unfinished batches are counted, itself included: of
  creates that race, the last to count sees every one inserted before it, so together they never
  pass a limit (exact), though racing creates at the edge may all be refused (and retry);
- a validated batch stores its lines and tokens (``enqueued_at``), then is counted against the
  batches that stored theirs before it, so the first in wins; validations that end within one
  MongoDB round trip of each other may both pass (a small overshoot, never a batch failed for
  another that came later);
- an upload is checked against the files stored when it starts and, when its size was unknown,
  again when it ends: concurrent uploads of one project may overshoot by those in flight.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from prometheus_client import Counter

from services.api.quotas.limits import (
    ModelUse,
    Refusal,
    batch_refusal,
    count_refusal,
    queue_refusal,
    queued_use,
    stored_refusal,
)
from services.api.quotas.settings import QuotaSettings
from shared.errors import QuotaExceeded
from shared.protocol.extensions import LimitUse, ModelLimits, ProjectLimitsView
from shared.stores.batches import BatchStore
from shared.stores.files import FileStore
from shared.stores.models import ModelStore

log = logging.getLogger(__name__)

REFUSALS = Counter(
    "batchstream_api_quota_refusals_total",
    "Requests answered 429 and batches failed at validation by a project quota",
    ["limit"],
)


class QuotaService:
    def __init__(
        self, settings: QuotaSettings, batches: BatchStore, files: FileStore, models: ModelStore
    ) -> None:
        self.settings = settings
        self.batches = batches
        self.files = files
        self.models = models

    def _raise(self, project: str, refusal: Refusal | None) -> None:
        if refusal is None:
            return
        REFUSALS.labels(refusal.limit).inc()
        log.info("request refused by a quota", extra={"project": project, "limit": refusal.limit})
        wait = self.settings.retry_after_s
        if refusal.limit == "concurrent_validations":
            wait = self.settings.validation_retry_after_s
        raise QuotaExceeded(refusal.message, limit=refusal.limit, code=refusal.code, retry_after_s=wait)

    # ---------------------------------------------------------------- files

    async def check_upload(self, project: str, size: int) -> None:
        """429 when ``size`` more bytes would take the project past its stored bytes."""
        limits = self.settings.limits(project)
        if limits.stored_bytes:
            self._raise(project, stored_refusal(limits, await self.files.stored_bytes(project), size))

    # ---------------------------------------------------------------- batches

    def counts_queue(self, project: str) -> bool:
        """True when the project has a per-model limit (a create then reads its model)."""
        limits = self.settings.limits(project)
        return bool(limits.queued_lines or limits.enqueued_tokens)

    async def check_create(self, project: str, model: str | None) -> None:
        """429 when the project is at its batches in progress, its concurrent validations, or
        (``model`` given) that model's queued lines or enqueued tokens."""
        limits = self.settings.limits(project)
        if limits.batches_in_progress or limits.concurrent_validations:
            self._raise(project, count_refusal(limits, *await self.batches.open_counts(project)))
        if model is not None and self.counts_queue(project):
            use = queued_use(await self.batches.enqueued(project)).get(model, ModelUse())
            self._raise(project, queue_refusal(model, limits, use))

    async def admit(self, project: str) -> None:
        """After the batch was inserted (validating): 429 when the project's batches, this one
        included, are past a limit."""
        limits = self.settings.limits(project)
        if limits.batches_in_progress or limits.concurrent_validations:
            unfinished, validating = await self.batches.open_counts(project)
            self._raise(project, count_refusal(limits, unfinished - 1, validating - 1))

    async def batch_refusal(
        self, project: str, batch_id: str, mine: Mapping[str, ModelUse], enqueued_at: int | None = None
    ) -> Refusal | None:
        """Why a validated batch fails (``mine``: its lines and tokens per model), or None: the
        project's other unfinished batches (those that stored theirs before ``enqueued_at`` if
        given) plus this one past a model's limit."""
        if not self.counts_queue(project):
            return None
        others = [
            b
            for b in await self.batches.enqueued(project)
            if b.batch_id != batch_id and (enqueued_at is None or b.enqueued_at < enqueued_at)
        ]
        use = queued_use(others)
        limits = self.settings.limits(project)
        for model, adding in sorted(mine.items()):
            refusal = batch_refusal(model, limits, use.get(model, ModelUse()), adding)
            if refusal is not None:
                REFUSALS.labels(refusal.limit).inc()
                return refusal
        return None

    # ---------------------------------------------------------------- the usage view

    async def view(self, project: str) -> ProjectLimitsView:
        """The project's limits and its use of each (per model where per model)."""
        limits = self.settings.limits(project)
        unfinished, validating = await self.batches.open_counts(project)
        use = queued_use(await self.batches.enqueued(project))
        models = sorted(set(use) | set(await self.models.served()))
        return ProjectLimitsView(
            project=project,
            stored_bytes=LimitUse.of(limits.stored_bytes, await self.files.stored_bytes(project)),
            batches_in_progress=LimitUse.of(limits.batches_in_progress, unfinished),
            concurrent_validations=LimitUse.of(limits.concurrent_validations, validating),
            models=[
                ModelLimits(
                    model=m,
                    queued_lines=LimitUse.of(limits.queued_lines, use.get(m, ModelUse()).lines),
                    enqueued_tokens=LimitUse.of(limits.enqueued_tokens, use.get(m, ModelUse()).tokens),
                )
                for m in models
            ],
        )
