"""Acting on the journey books (``sent_lines.py``): lost lines sent again, cancels settled.

Every ``journey_check_seconds``, for each model this replica dispatches: read the ``seen_lines`` of
the batches with lines sent (those with a result before the group's commit leave the measured
backlog: ``meter.py``), send again those overdue without a result (a
bounded number per check, read with merged ranged GETs), publish ``line_lost`` results for lines
out of attempts, and act on a takeover's doubts. Cancelling batches whose sent lines all came back
are marked ``dispatch_settled`` so the aggregator ends them without waiting for its timeout.
"""

from __future__ import annotations

import logging

from services.api.dispatch import metrics
from services.api.dispatch.reader import InputLine, read_lines
from services.api.dispatch.sender import LineSender, Refused
from services.api.dispatch.settings import DispatchSettings
from services.api.dispatch.state import ModelState, QueuedState, Sending
from shared.seen_lines import SeenLines
from shared.storage import ObjectStore
from shared.stores.dispatcher import DispatchQueueStore

log = logging.getLogger(__name__)


class Recovery:
    def __init__(
        self, queue: DispatchQueueStore, store: ObjectStore, sender: LineSender, settings: DispatchSettings
    ) -> None:
        self.queue, self.store, self.sender, self.settings = queue, store, sender, settings

    async def check(self, model: str, state: ModelState, batches: dict[str, QueuedState], now: float) -> None:
        """``batches``: the model's, by batch id (a batch has one dispatch unit per model)."""
        await self._settle_cancels(state, [b for b in batches.values() if b.model == model], now)
        to_check = state.book.batches_to_check()
        state.book.forget(b for b in to_check if b not in batches)
        running = [b for b in to_check if b in batches and batches[b].dispatchable(now)]
        for batch_id, seen in (await self._seen(running)).items():
            await self._settle(model, state, batches[batch_id], seen, now)

    async def _seen(self, batch_ids: list[str]) -> dict[str, SeenLines]:
        if not batch_ids:
            return {}
        return await self.queue.seen_lines(batch_ids)

    async def _settle_cancels(self, state: ModelState, batches: list[QueuedState], now: float) -> None:
        """Cancelling batches whose sent lines all came back may end now (``dispatch_settled``);
        the lines never sent get ``batch_cancelled`` error lines at finalize."""
        cancelling = {b.batch_id: b for b in batches if b.status == "cancelling" and not b.settled}
        for batch_id, seen in (await self._seen(list(cancelling))).items():
            if state.book.cancel_settled(batch_id, seen, now):
                batch = cancelling[batch_id]
                await self.queue.settle_dispatch(batch_id, batch.part, batch.parts)
                cancelling[batch_id].settled = True
                await cancelling[batch_id].close_cursor()

    async def _settle(
        self, model: str, state: ModelState, batch: QueuedState, seen: SeenLines, now: float
    ) -> None:
        again, lost = state.book.settle(batch.batch_id, seen, now)
        again = again[: self.settings.round_lines]  # bounded work per check; the rest stay due
        resend: list[Sending] = []
        outgoing = await self.sender.round(state.topic)
        raws = await read_lines(self.store, batch.object_key, [(x.start, x.length) for x in again])
        for line, raw in zip(again, raws, strict=True):
            item = InputLine(line.line, line.start, raw)
            outgoing.add(self.sender.request(batch, item))
            resend.append(Sending(batch, item, line.attempt + 1))
        doubt = state.book.due_doubt(batch.batch_id, now)
        # In file order the lines sent are those numbered below the position, so a count of the
        # results below it tells whether any is missing; in a dispatch order they are the
        # order's first entries, whatever their numbers: look (one read of the order's head).
        if doubt is not None and (batch.ordered or seen.count_below(doubt.upto_line) < doubt.sent):
            # Some line an earlier dispatcher sent has no result: find which (reads the file).
            async for item in batch.sent_before(self.store, doubt.upto_line, doubt.upto_byte):
                if item.number not in seen and not state.book.tracked(batch.batch_id, item.number):
                    outgoing.add(self.sender.request(batch, item))
                    resend.append(Sending(batch, item, 2))
        placed = await outgoing.send()
        refused: list[tuple[InputLine, Refused]] = []
        for sending, where in zip(resend, placed, strict=True):
            if isinstance(where, Refused):
                refused.append((sending.line, where))
                state.book.forget_line(batch.batch_id, sending.line.number)
            else:
                state.record(sending, *where)
        if refused:
            await self.sender.undeliverable(batch.batch_id, refused)
            metrics.UNDELIVERABLE.labels(model).inc(len(refused))
        if resend:
            metrics.RESENT.labels(model).inc(len(resend))
            log.warning(
                "sent lines again: consumed but never answered",
                extra={"batch_id": batch.batch_id, "lines": [s.line.number for s in resend][:20]},
            )
        if lost:
            raws = await read_lines(self.store, batch.object_key, [(x.start, x.length) for x in lost])
            await self.sender.lost(batch.batch_id, lost, raws)
            metrics.LOST.labels(model).inc(len(lost))
            log.error(
                "gave up on lines: sent %d times, never answered",
                self.settings.max_attempts,
                extra={"batch_id": batch.batch_id, "lines": [x.line for x in lost][:20]},
            )
