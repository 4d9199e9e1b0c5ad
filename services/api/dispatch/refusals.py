"""Lines answered with an error result instead of being run: a mixed batch's lines that name no
served model (``model_not_found``), and lines the broker refused for good (``sender.py``).

Each error result is published to the results topic like a line's result, so the aggregator
counts it like any other and the batch can still complete.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from contextlib import aclosing

from services.api.dispatch import metrics
from services.api.dispatch.reader import InputLine
from services.api.dispatch.sender import LineSender, Refused
from services.api.dispatch.settings import DispatchSettings
from services.api.dispatch.state import REFUSALS, QueuedState, Sending
from shared.storage import ObjectStore
from shared.stores.dispatcher import DispatchQueueStore

log = logging.getLogger(__name__)


class Refusals:
    def __init__(
        self, queue: DispatchQueueStore, store: ObjectStore, sender: LineSender, settings: DispatchSettings
    ) -> None:
        self.queue, self.store, self.sender, self.settings = queue, store, sender, settings

    async def answer(self, batches: Iterable[QueuedState], now: float) -> int:
        """The lines of mixed batches that name no served model: each one's ``model_not_found``
        error result, published like the lines' results (bounded per round); a cancelled batch's
        are left to finalize (``batch_cancelled``), and its refusals part is settled at once."""
        answered = 0
        for batch in [b for b in batches if b.model == REFUSALS]:
            if batch.status == "cancelling" and not batch.settled and await self._counted(batch):
                await self.queue.settle_dispatch(batch.batch_id, batch.part, batch.parts)
                batch.settled = True
            if not batch.dispatchable(now) or batch.remaining <= 0:
                continue
            cursor = batch.open_cursor(self.store)
            try:
                lines = await batch.take_unanswered(cursor, self.settings.round_lines - answered)
                await self.sender.refuse(batch.batch_id, lines)
            except Exception:
                batch.skipped = 0
                await batch.close_cursor()
                raise
            batch.position.sent += len(lines)
            batch.advance(now)
            answered += len(lines)
            if answered >= self.settings.round_lines:
                break
        return answered

    async def _counted(self, batch: QueuedState) -> bool:
        """Whether the aggregator has counted every refusal sent for the batch (so none is filled
        as ``batch_cancelled`` at its end): one read of the order's head, on a cancel only."""
        if batch.position.sent == 0:
            return True
        seen = (await self.queue.seen_lines([batch.batch_id])).get(batch.batch_id)
        if seen is None:
            return False
        p = batch.position
        async with aclosing(batch.sent_before(self.store, p.line, p.byte)) as sent:
            async for item in sent:
                if item.number not in seen:
                    return False
        return True

    async def undeliverable(
        self, model: str, pending: list[Sending], placed: list[tuple[int, int] | Refused]
    ) -> int:
        """Publish the error result of each line the broker refused for good (``sender.py``);
        how many."""
        by_batch: dict[str, list[tuple[InputLine, Refused]]] = {}
        for item, where in zip(pending, placed, strict=True):
            if isinstance(where, Refused):
                by_batch.setdefault(item.batch.batch_id, []).append((item.line, where))
        for batch_id, lines in by_batch.items():
            await self.sender.undeliverable(batch_id, lines)
            log.error(
                "lines refused for good: each is its own error result",
                extra={"batch_id": batch_id, "model": model, "lines": [x.number for x, _ in lines][:20]},
            )
            metrics.UNDELIVERABLE.labels(model).inc(len(lines))
        return sum(len(lines) for lines in by_batch.values())
