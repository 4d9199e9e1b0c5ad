"""The dispatcher task the api lifespan starts: one loop per api process, all models.

Each round, for every model with queued batches whose lease this replica holds: read the group's
backlog (``meter``), ask the policy how to split what the topic may take (``policy``), read those
lines from the input files in object storage (``reader``), publish one ``RequestMessage`` per line,
record each line's partition and offset (``sent_lines``) and advance the batch's position
(``PositionStore``, persisted every ``position_flush_s``). Every ``journey_check_seconds`` the lines
consumed but never answered are sent again (``recovery``). The batch service marks a validated batch
``dispatchable`` and wakes the loop; cancelled and expired batches simply stop being dispatched.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from collections.abc import Callable

from aiokafka import AIOKafkaProducer
from tenacity import AsyncRetrying, before_sleep_log, retry_if_exception_type, wait_exponential

from services.api.announcer import ControlAnnouncer
from services.api.dispatch import metrics
from services.api.dispatch.meter import GroupProbe, done_past
from services.api.dispatch.order import OrderCursor
from services.api.dispatch.policy import QueuedBatch, at_risk
from services.api.dispatch.recovery import Recovery
from services.api.dispatch.refusals import Refusals
from services.api.dispatch.sender import LineSender, Refused
from services.api.dispatch.settings import DispatchSettings
from services.api.dispatch.state import REFUSALS, ModelState, QueuedState, Sending
from shared.kafka import ensure_topics, make_admin
from shared.mongo import Mongo
from shared.protocol.messages import ControlMessage
from shared.protocol.openai import BatchError
from shared.settings import KafkaSettings
from shared.storage import ObjectNotFound, ObjectStore
from shared.stores.batches import BatchStore
from shared.stores.dispatcher import DispatchQueueStore, DispatchView, LeaseStore, Position, PositionStore
from shared.stores.files import FileStore
from shared.topics import inference_group, requests_topic

log = logging.getLogger(__name__)

MODEL_RETRY_S, MODEL_RETRY_MAX_S = 0.2, 5.0
UNREADABLE: tuple[type[Exception], ...] = (ObjectNotFound, ValueError, struct.error)
"""Reading a batch's lines failed for good: its input or dispatch order is gone or corrupt (a
decoding error is a ``ValueError``). Any other error (storage unreachable) is tried again."""
UNREADABLE_CODE = "input_unreadable"
UNREADABLE_MESSAGE = "The batch's input could not be read to send its lines: {reason}"
MAX_REASON_CHARS = 200


class Dispatcher:
    def __init__(
        self,
        *,
        mongo: Mongo,
        batches: BatchStore,
        files: FileStore,
        store: ObjectStore,
        producer: AIOKafkaProducer,
        kafka: KafkaSettings,
        settings: DispatchSettings,
        owner: str,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.batch_store, self.files, self.store, self.producer = batches, files, store, producer
        self.kafka, self.settings = kafka, settings
        self.clock = clock
        self.leases = LeaseStore(mongo.dispatch_leases, owner, settings.lease_ttl_s)
        self.positions = PositionStore(mongo.dispatch_positions)
        self.queue = DispatchQueueStore(mongo.batches)
        self.probe = GroupProbe(make_admin(kafka))
        self.sender = LineSender(producer, kafka)
        self.announcer = ControlAnnouncer(producer, kafka)
        self.recovery = Recovery(self.queue, store, self.sender, settings)
        self.refusals = Refusals(self.queue, store, self.sender, settings)
        self.batches: dict[str, QueuedState] = {}
        self.models: dict[str, ModelState] = {}
        self._ensured: set[str] = set()
        self._wake = asyncio.Event()
        self._refresh_now = True
        self._refreshed_at = 0.0
        self._journeys_at = 0.0
        self._task: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ life

    def start(self) -> None:
        self._task = asyncio.create_task(self.run(), name="dispatcher")

    def wake(self) -> None:
        """A batch became dispatchable (or changed): look at the queue now, not next refresh."""
        self._refresh_now = True
        self._wake.set()

    async def stop(self) -> None:
        """Stop dispatching, persist positions and hand the leases over at once."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        try:
            await self._save_positions(self.clock(), force=True)
            await self.leases.release([m for m, s in self.models.items() if s.held_at is not None])
        except Exception:
            log.exception("dispatcher shutdown: could not save positions or release leases")
        for state in self.batches.values():
            await state.close_cursor()
        await self.probe.close()

    async def run(self) -> None:
        while True:
            if await self._round_retrying() >= self.settings.round_lines:
                await asyncio.sleep(0)  # a full round: more may be due at once
                continue
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=self._pause(self.clock()))
            except TimeoutError:
                pass
            self._wake.clear()

    def _pause(self, now: float) -> float:
        """Seconds until a round has something to do: at once when the queue must be read again
        (a lease just taken), the next meter of a model whose lines wait (only a new reading of
        the group's offsets lets more lines go), else the next refresh. Never longer than the
        shortest of the other timers (lease, journeys, positions), whatever the settings."""
        if self._refresh_now:
            return 0.0
        s = self.settings
        due = [self._refreshed_at + s.refresh_seconds]
        for model, state in self.models.items():
            if state.retry_at > now:
                due.append(state.retry_at)
                continue
            # Only where lines wait: ``_meter`` runs only for a model with batches, so an idle
            # model's reading would stay due and the loop would never rest.
            if state.held_at is not None and model != REFUSALS and self._lines_waiting(model, now):
                due.append(self._next_reading(model, waiting=True))
        longest = min(s.refresh_seconds, s.lease_renew_s, s.journey_check_seconds, s.position_flush_s)
        return min(longest, max(0.0, min(due) - now))  # bounded even if the wall clock jumps back

    def _next_reading(self, model: str, waiting: bool) -> float:
        """When the group's offsets are read next: as the backlog drains while lines wait to be
        sent (``meter.Backlog.reading_interval``), else only as often as the journeys are checked
        (``recovery`` needs the commits)."""
        state, s = self._model(model), self.settings
        if waiting:
            return state.metered_at + state.backlog.reading_interval(s.meter_seconds, s.journey_check_seconds)
        return state.metered_at + s.journey_check_seconds

    def _lines_waiting(self, model: str, now: float) -> bool:
        return any(
            b.model == model and b.remaining > 0 and b.dispatchable(now) for b in self.batches.values()
        )

    async def _round_retrying(self) -> int:
        """A round, tried again with backoff while a dependency fails (MongoDB, Kafka, S3)."""
        retrying = AsyncRetrying(
            wait=wait_exponential(multiplier=0.2, max=5.0),
            retry=retry_if_exception_type(Exception),
            before_sleep=before_sleep_log(log, logging.WARNING, exc_info=True),
        )
        async for attempt in retrying:
            with attempt:
                return await self.round()
        return 0  # not reached: it retries until a round succeeds

    # ----------------------------------------------------------------- round

    async def round(self) -> int:
        """One dispatch round over every model; returns the lines sent."""
        now = self.clock()
        if self._refresh_now or now - self._refreshed_at >= self.settings.refresh_seconds:
            await self._refresh(now)
        sent = 0
        for model in sorted({s.model for s in self.batches.values()}):
            if self._model(model).retry_at > now:
                continue  # its last try failed: backing off (the other models go on)
            try:
                if model == REFUSALS:
                    if await self._lead(model, now):
                        sent += await self.refusals.answer(self.batches.values(), now)
                elif await self._lead(model, now):
                    await self._meter(model, now)
                    sent += await self._dispatch(model, now)
            except Exception:
                self._back_off(model, now)
            else:
                self._model(model).failures = 0
        if now - self._journeys_at >= self.settings.journey_check_seconds:
            self._journeys_at = now
            for model, state in list(self.models.items()):
                if state.held_at is not None and model != REFUSALS and state.retry_at <= now:
                    mine = {s.batch_id: s for s in self.batches.values() if s.model == model}
                    try:
                        await self.recovery.check(model, state, mine, now)
                    except Exception:
                        self._back_off(model, now)
        await self._save_positions(now)
        self._publish_metrics()
        metrics.ROUNDS.inc()
        return sent

    def _back_off(self, model: str, now: float) -> None:
        """One model's round failed (a dependency, most likely): it waits, doubling from
        ``MODEL_RETRY_S`` up to ``MODEL_RETRY_MAX_S``, and the other models are not held up."""
        state = self._model(model)
        state.failures += 1
        wait = min(MODEL_RETRY_MAX_S, MODEL_RETRY_S * 2 ** (state.failures - 1))
        state.retry_at = now + wait
        log.warning(
            "dispatching a model failed; tried again in %.1f s", wait, exc_info=True, extra={"model": model}
        )

    async def _refresh(self, now: float) -> None:
        self._refresh_now, self._refreshed_at = False, now
        views = await self.queue.views()
        fresh = [v for v in views if v.unit not in self.batches and (v.model or v.part is not None)]
        if fresh:
            await self._add(fresh, now)
        for view in views:
            state = self.batches.get(view.unit)
            if state is not None:
                state.status = view.status
        gone = set(self.batches) - {v.unit for v in views}
        if gone:
            await self._forget(gone)

    async def _add(self, views: list[DispatchView], now: float) -> None:
        positions = await self.positions.load([v.unit for v in views])
        keys = await self.files.object_keys(list({v.input_file_id for v in views}))
        # A batch resumed after a broker loss: its lines with a stored result are not sent again.
        answered = await self.queue.seen_lines([v.batch_id for v in views if v.resumed])
        for view in views:
            key = keys.get(view.input_file_id)
            if key is None:
                continue  # the input file is gone: the batch cannot run (finalize fills it)
            position = Position.from_document(positions.get(view.unit), done=view.emitted)
            state = QueuedState.from_view(view, key, position)
            state.answered = answered.get(view.batch_id)
            self.batches[state.unit] = state
            if state.model == REFUSALS:
                continue  # answered here, never on Kafka's requests topics
            # Lines an earlier dispatcher sent: their offsets are unknown here (sent_lines.py).
            book = self._model(state.model).book
            book.doubt(state.batch_id, position.line, position.byte, position.sent, now)

    async def _forget(self, units: set[str]) -> None:
        for unit in units:
            state = self.batches.pop(unit, None)
            if state is None:
                continue
            await state.close_cursor()
            self._model(state.model).book.forget([state.batch_id])
        for model, model_state in self.models.items():
            model_state.policy.forget({s.project for s in self.batches.values() if s.model == model})

    def _model(self, model: str) -> ModelState:
        found = self.models.get(model)
        if found is None:
            found = self.models[model] = ModelState.new(requests_topic(self.kafka, model), self.settings)
        return found

    async def _lead(self, model: str, now: float) -> bool:
        """Hold the model's lease; on taking it over, start from what MongoDB says."""
        state = self._model(model)
        if state.held_at is not None and now - state.held_at < self.settings.lease_renew_s:
            return True
        held = await self.leases.hold(model, now)
        was_held = state.held_at is not None
        state.held_at = now if held else None
        if model != REFUSALS:
            metrics.LEADER.labels(model).set(1 if held else 0)
        if held and not was_held:
            log.info("dispatching", extra={"model": model, "owner": self.leases.owner})
            await self._reload_model(model)
            return False
        if not held and was_held:
            log.info("lost the dispatch lease", extra={"model": model})
            await self._save_positions(now, force=True)
            await self._reload_model(model)
        return held

    async def _reload_model(self, model: str) -> None:
        """Drop what this process knew of the model's batches; the next refresh reloads them."""
        await self._forget({b for b, s in self.batches.items() if s.model == model})
        state = self.models.pop(model)
        self._model(model).held_at = state.held_at
        self._refresh_now = True

    async def _meter(self, model: str, now: float) -> None:
        """Read the group's offsets when due (``_next_reading``)."""
        waiting = self._lines_waiting(model, now)
        if now < self._next_reading(model, waiting):
            return
        state = self._model(model)
        state.metered_at = now
        await self._ensure_topic(model)
        if not state.partitions:
            state.partitions = len(await self.producer.partitions_for(state.topic) or ()) or 1
        group = inference_group(self.kafka, model)
        try:
            reading = await self.probe.read(group, state.topic, state.partitions)
        except Exception as exc:
            log.warning("reading the group's offsets failed: %s", exc, extra={"model": model})
            return
        state.book.committed(reading.committed, now)
        done, read_to = done_past(reading, state.book.answered_by_partition())
        state.backlog.observe(reading.committed, reading.members, now, waiting, done, read_to)
        metrics.TOPIC_BACKLOG.labels(model).set(state.backlog.lag)
        metrics.TARGET_BACKLOG.labels(model).set(state.backlog.target)

    async def _ensure_topic(self, model: str) -> None:
        if model not in self._ensured:
            await ensure_topics(self.kafka, [model])
            self._ensured.add(model)

    # -------------------------------------------------------------- dispatch

    async def _dispatch(self, model: str, now: float) -> int:
        state = self._model(model)
        queue = self._queue(model, state, now)
        lineup = state.policy.lineup(queue, now)
        # A batch not started yet gets its first lines beyond the allowance (policy.py), up to a
        # second target in the topic.
        starting = min(lineup.head_start_lines, state.backlog.head_room())
        allowance = state.backlog.allowance(state.book.in_topic())
        budget = min(self.settings.round_lines, max(allowance, starting))
        if budget <= 0 or not queue:
            return 0
        log.debug(
            "dispatch round",
            extra={
                "model": model,
                "budget": budget,
                "lag": state.backlog.lag,
                "target": state.backlog.target,
                "rate": round(state.backlog.rate),
                "queued": len(queue),
            },
        )
        pending: list[Sending] = []
        read: list[QueuedState] = []
        load = state.book.in_topic_by_partition() if self.settings.affinity else {}
        outgoing = await self.sender.round(state.topic)
        try:
            for grant in state.policy.plan(lineup, budget):
                batch = self.batches.get(grant.batch_id)  # the policy's batch is a dispatch unit
                if batch is None:
                    continue  # failed this round (``_unreadable``)
                try:
                    cursor = batch.open_cursor(self.store)
                    lines = await batch.take_unanswered(cursor, grant.lines)
                except UNREADABLE as exc:
                    await self._unreadable(batch, exc)
                    continue
                read.append(batch)
                for line in lines:
                    partition = None
                    if self.settings.affinity and isinstance(cursor, OrderCursor):
                        entry = cursor.placed.get(line.number)
                        partition = state.affinity.partition(entry, state.partitions, load)
                        if partition is not None:
                            load[partition] = load.get(partition, 0) + 1
                    outgoing.add(self.sender.request(batch, line), partition)
                    pending.append(Sending(batch, line))
            placed = await outgoing.send()
            refused = await self.refusals.undeliverable(model, pending, placed)
        except Exception:
            for batch in read:  # read again from the last acknowledged position
                batch.skipped = 0
                await batch.close_cursor()
            raise
        for item, where in zip(pending, placed, strict=True):
            if not isinstance(where, Refused):
                state.record(item, *where)
            item.batch.position.sent += 1
        sent_at = self.clock()
        for batch in read:  # every line read is on Kafka: the positions move past them
            batch.advance(sent_at)
        metrics.DISPATCHED.labels(model).inc(len(pending) - refused)
        return len(pending)

    def _queue(self, model: str, state: ModelState, now: float) -> list[QueuedBatch]:
        """The model's batches as the policy sees them, each with its deadline risk (``at_risk``:
        its own send rate, the rate the group commits, shared between the model's batches)."""
        units = [s for s in self.batches.values() if s.model == model and s.status == "in_progress"]
        return [
            unit.queued(
                at_risk(
                    unit.remaining,
                    unit.rate.per_second(now, unit.position.sent),
                    state.backlog.rate,
                    len(units),
                    unit.expires_at - now,
                    self.settings.deadline_margin_s,
                )
            )
            for unit in units
        ]

    async def _unreadable(self, batch: QueuedState, exc: Exception) -> None:
        """A batch whose input (or dispatch order) cannot be read ends ``failed``, saying so; the
        other batches go on. Its lines already sent are not run (a cancel on the control topic)."""
        log.error(
            "a batch's input cannot be read: it fails", exc_info=exc, extra={"batch_id": batch.batch_id}
        )
        reason = f"{type(exc).__name__}: {exc}"[:MAX_REASON_CHARS]
        error = BatchError(code=UNREADABLE_CODE, message=UNREADABLE_MESSAGE.format(reason=reason))
        if await self.batch_store.fail(batch.batch_id, [error]):
            await self.announcer.announce(
                ControlMessage(batch_id=batch.batch_id, model=batch.model, cancelled=True)
            )
        await self._forget({u for u, s in self.batches.items() if s.batch_id == batch.batch_id})

    # ------------------------------------------------------------- positions

    async def _save_positions(self, now: float, force: bool = False) -> None:
        """Store the positions due (every ``position_flush_s``, at once when a batch is wholly
        sent or on ``force``) in one request; then mark the batches wholly sent ``emitted``."""
        due = [
            batch
            for batch in self.batches.values()
            if batch.dirty
            and (force or batch.position.done or now - batch.saved_at >= self.settings.position_flush_s)
        ]
        await self.positions.save({batch.unit: batch.position for batch in due})
        for batch in due:
            batch.dirty, batch.saved_at = False, now
            if batch.position.done and not batch.emitted:
                await self.queue.mark_emitted(batch.batch_id, batch.part, batch.parts)
                batch.emitted = True
                await batch.close_cursor()

    def _publish_metrics(self) -> None:
        queued: dict[tuple[str, str], int] = {}
        for batch in self.batches.values():
            if batch.model == REFUSALS:
                continue
            if batch.status == "in_progress" and self._model(batch.model).held_at is not None:
                key = (batch.model, batch.project)
                queued[key] = queued.get(key, 0) + batch.remaining
        metrics.QUEUED_LINES.clear()
        for (model, project), lines in queued.items():
            metrics.QUEUED_LINES.labels(model, project).set(lines)
