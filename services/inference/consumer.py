"""The poll/commit loop: many requests in flight, results published, offsets committed in order.

Each message becomes a task; when ``in_flight_limit`` tasks are on the engine the worker stops
polling until a place frees (``getmany`` takes at most the free places; what aiokafka fetched
beyond them stays in its buffer). A window that stays full polls every ``KEEPALIVE_POLL_S`` with
its partitions paused, so the group does not drop a member whose engine is busy with long requests.

A result is published (``publisher.py``: a batch's results that finish together share one
message), and its publish acknowledged by the broker, before its offset
counts as done; a request waiting for that acknowledgement has left the engine and no longer holds
one of its places (else a fast engine would idle for every round trip to the broker;
``max_publishing`` bounds those waiting); a partition commits only up to its lowest offset
still in flight (see ``offsets.OffsetTracker``). A publish the broker refuses or does not confirm
is tried again (bounded, random exponential backoff); when every try fails the worker stops
without that line's offset committed, and whoever owns the partition next runs the line again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import pydantic
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka.abc import ConsumerRebalanceListener
from aiokafka.errors import CommitFailedError, KafkaError

from services.inference import metrics
from services.inference.handler import RequestHandler, never_ran
from services.inference.offsets import OffsetTracker
from services.inference.publisher import ResultPublisher
from services.inference.settings import InferenceSettings, default
from shared.kafka import connection, decode
from shared.protocol.messages import (
    LineError,
    RequestLike,
    RequestMessage,
    ResultMessage,
    read_plain_request,
)
from shared.settings import KafkaSettings
from shared.topics import inference_group, requests_topic, results_topic

log = logging.getLogger(__name__)

# The poll timeout also bounds how long finished lines wait for a commit while no new lines come
# (the dispatcher counts them as queued until then: WORKER_COMMIT_INTERVAL_S).
POLL_TIMEOUT_MS = 100
# The group drops a member that has not polled for this long (its lines go to the others).
MAX_POLL_INTERVAL_MS = 300_000
# A full window still polls this often (partitions paused), well within MAX_POLL_INTERVAL_MS.
# Not on every wake-up: aiokafka drops the records it buffered for a paused partition, and the
# worker would fetch and decode them again after the resume. Whoever builds a consumer with a
# shorter deadline must pass a keep-alive to match (``keepalive_poll_s``).
KEEPALIVE_POLL_S = MAX_POLL_INTERVAL_MS / 1000 / 10


class FatalConsumerError(RuntimeError):
    """The worker cannot go on (e.g. results cannot be published); exit and be restarted."""


def consumer_options(settings: InferenceSettings) -> dict[str, Any]:
    """``make_consumer`` options from the settings: a static group member when
    ``group_instance_id`` is set (a restarted worker takes its partitions back without waiting for
    its dead predecessor's session to expire), and the session and heartbeat that decide how fast a
    killed or frozen worker's partitions move to the others."""
    return {
        "group_instance_id": settings.group_instance_id or None,
        "session_timeout_ms": round(settings.session_timeout_s * 1000),
        "heartbeat_interval_ms": round(settings.heartbeat_interval_s * 1000),
        "fetch_max_wait_ms": settings.fetch_max_wait_ms,
    }


def make_consumer(kafka: KafkaSettings, group: str, **overrides: Any) -> AIOKafkaConsumer:
    options: dict[str, Any] = {
        **connection(kafka),
        "group_id": group,
        "enable_auto_commit": False,
        "auto_offset_reset": "earliest",
        "max_poll_interval_ms": MAX_POLL_INTERVAL_MS,
    }
    options.update(overrides)
    return AIOKafkaConsumer(**options)


class _Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, owner: RequestConsumer) -> None:
        self.owner = owner

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        await self.owner.on_revoked(revoked)

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        self.owner.joined = True
        log.info("partitions assigned", extra={"partitions": sorted(map(str, assigned))})


class RequestConsumer:
    """Consumes one model's requests topic and runs every message through the handler."""

    def __init__(
        self,
        consumer: AIOKafkaConsumer,
        producer: AIOKafkaProducer,
        handler: RequestHandler,
        *,
        topic: str,
        results_topic: str,
        in_flight_limit: int,
        max_publishing: int = default("max_publishing"),
        drain_timeout_s: float = default("drain_timeout_s"),
        publish_attempts: int = default("publish_attempts"),
        publish_retry_max_wait_s: float = default("publish_retry_max_wait_s"),
        commit_interval_s: float = default("commit_interval_s"),
        keepalive_poll_s: float = KEEPALIVE_POLL_S,
    ) -> None:
        self.consumer = consumer
        self.producer = producer
        self.handler = handler
        self.topic = topic
        self.results_topic = results_topic
        self.in_flight_limit = max(1, in_flight_limit)
        self.max_publishing = max(1, max_publishing)
        self.drain_timeout_s = drain_timeout_s
        self.publisher = ResultPublisher(
            producer, attempts=publish_attempts, retry_max_wait_s=publish_retry_max_wait_s
        )
        self.commit_interval_s = commit_interval_s
        self.keepalive_poll_s = keepalive_poll_s
        self.offsets: OffsetTracker[TopicPartition] = OffsetTracker()
        self.running = False
        self.joined = False  # the group was joined (Kafka answered); see /readyz
        self._stopping = asyncio.Event()
        self._tasks: dict[asyncio.Task[None], str] = {}
        self._engine: set[asyncio.Task[None]] = set()  # tasks whose result is not yet known
        self._room = asyncio.Event()  # set when a request leaves the engine or ends
        self._last_commit = 0.0
        self._last_poll = time.monotonic()
        self._fatal: BaseException | None = None

    @classmethod
    def from_settings(
        cls,
        kafka: KafkaSettings,
        inference: InferenceSettings,
        producer: AIOKafkaProducer,
        handler: RequestHandler,
    ) -> RequestConsumer:
        model_id = handler.engine.model_id
        consumer = make_consumer(kafka, inference_group(kafka, model_id), **consumer_options(inference))
        return cls(
            consumer,
            producer,
            handler,
            topic=requests_topic(kafka, model_id),
            results_topic=results_topic(kafka),
            in_flight_limit=inference.in_flight_limit,
            max_publishing=inference.max_publishing,
            drain_timeout_s=inference.drain_timeout_s,
            publish_attempts=inference.publish_attempts,
            publish_retry_max_wait_s=inference.publish_retry_max_wait_s,
            commit_interval_s=inference.commit_interval_s,
        )

    def stop(self) -> None:
        """Ask the loop to stop fetching, drain in-flight work, commit and return."""
        self._stopping.set()

    async def run(self) -> None:
        """Start the consumer, run until ``stop()``, then drain and close it."""
        await self.consumer.start()
        self.consumer.subscribe([self.topic], listener=_Rebalance(self))
        metrics.IN_FLIGHT.set_function(self._in_flight)  # read at each scrape, not set per line
        self.running = True
        log.info("consuming", extra={"topic": self.topic, "limit": self.in_flight_limit})
        try:
            await self._loop()
            await self._drain()
            await self._commit()
        finally:
            self.running = False
            self.joined = False
            await self.consumer.stop()
        if self._fatal is not None:
            raise FatalConsumerError(str(self._fatal)) from self._fatal

    def _in_flight(self) -> int:
        """Requests in the worker now, on the engine or waiting for a place (the in-flight gauge,
        read at each scrape)."""
        return len(self._engine)

    async def _loop(self) -> None:
        while not self._stopping.is_set():
            if self._room_left() <= 0:
                await self._wait_for_room()
            room = self._room_left()
            if room > 0 or time.monotonic() - self._last_poll >= self.keepalive_poll_s:
                await self._poll(room)
            if time.monotonic() - self._last_commit >= self.commit_interval_s:
                await self._commit()

    async def _poll(self, room: int) -> None:
        """Take up to ``room`` requests; with no room, a keep-alive poll of paused partitions."""
        self._apply_backpressure()
        self._last_poll = time.monotonic()
        timeout_ms = POLL_TIMEOUT_MS if room > 0 else 0
        batch = await self.consumer.getmany(timeout_ms=timeout_ms, max_records=max(1, room))
        for partition, records in batch.items():
            for record in records:
                self._start(partition, record)

    def _room_left(self) -> int:
        """Requests the worker may take now: places free on the engine, within the bound on
        requests held in all."""
        held_room = self.in_flight_limit + self.max_publishing - len(self._tasks)
        return min(self.in_flight_limit - len(self._engine), held_room)

    async def _wait_for_room(self) -> None:
        """Window full: wake as soon as a request leaves the engine or ends, not after a whole
        empty poll. (One event, set by each: waiting on the window's tasks themselves cost a
        callback added and removed per task at every wake-up.)"""
        self._room.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._room.wait(), POLL_TIMEOUT_MS / 1000)

    def _apply_backpressure(self) -> None:
        """Pause every assigned partition for a poll with the window full (idempotent; covers
        partitions assigned meanwhile), resume them once there is room."""
        if self._room_left() <= 0:
            self.consumer.pause(*self.consumer.assignment())
        elif self.consumer.paused():
            self.consumer.resume(*self.consumer.paused())

    def _start(self, partition: TopicPartition, record: ConsumerRecord[Any, Any]) -> None:
        epoch = self.offsets.start(partition, record.offset)
        where = f"{partition.topic}[{partition.partition}]@{record.offset}"
        task = asyncio.create_task(self._process(partition, record, epoch, where))
        self._tasks[task] = where
        self._engine.add(task)
        task.add_done_callback(self._task_done)

    def _left_engine(self, task: asyncio.Task[Any] | None) -> None:
        if task is not None:
            self._engine.discard(task)
        self._room.set()

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.pop(task, None)
        self._engine.discard(task)  # also a task cancelled before it ever ran
        self._room.set()
        if not task.cancelled() and task.exception() is not None and self._fatal is None:
            self._fatal = task.exception()
            self._stopping.set()

    async def _process(
        self, partition: TopicPartition, record: ConsumerRecord[Any, Any], epoch: int, where: str
    ) -> None:
        try:
            result, reply_topic = await self._result_for(record, where)
        finally:
            self._left_engine(asyncio.current_task())
        if result is not None:
            topic = reply_topic or self.results_topic
            await self.publisher.publish(result, topic, group=reply_topic is None, where=where)
        self.offsets.finish(partition, record.offset, epoch)

    async def _result_for(
        self, record: ConsumerRecord[Any, Any], where: str
    ) -> tuple[ResultMessage | None, str | None]:
        message: RequestLike | None = read_plain_request(record.value or b"")
        if message is None:  # not as the api writes it: pydantic coerces, or words the error
            try:
                raw = decode(record.value)
            except ValueError as exc:
                metrics.SKIPPED.inc()
                log.warning("skipping a message that is not a JSON object: %s", exc, extra={"at": where})
                return None, None
            try:
                message = RequestMessage.model_validate(raw)
            except pydantic.ValidationError as exc:
                return self._invalid(raw, exc, where), _str_or_none(raw.get("reply_topic"))
        if log.isEnabledFor(logging.DEBUG):
            context = {"batch_id": message.batch_id, "custom_id": message.custom_id, "at": where}
            log.debug("running request", extra=context)
        return await self.handler.handle(message), message.reply_topic

    def _invalid(
        self, raw: dict[str, Any], exc: pydantic.ValidationError, where: str
    ) -> ResultMessage | None:
        """An error result for a message that names its line well enough; else None (skipped)."""
        metrics.SKIPPED.inc()
        ids = {k: raw.get(k) for k in ("request_id", "custom_id", "batch_id")}
        log.warning(
            "invalid request message: %s", exc.errors(include_url=False)[:3], extra={"at": where, **ids}
        )
        if not (isinstance(ids["request_id"], str) and isinstance(ids["custom_id"], str)):
            return None
        stub = RequestMessage.model_construct(
            request_id=ids["request_id"],
            custom_id=ids["custom_id"],
            batch_id=_str_or_none(ids["batch_id"]),
            line=raw.get("line") if isinstance(raw.get("line"), int) else None,
        )
        detail = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'message'}: {e['msg']}" for e in exc.errors()[:5]
        )
        return never_ran(
            stub, LineError(code="invalid_request", message=f"Invalid request message: {detail}")
        )

    async def _commit(self, partitions: set[TopicPartition] | None = None) -> None:
        self._last_commit = time.monotonic()
        offsets = self.offsets.to_commit(partitions)
        if not offsets:
            return
        try:
            await self.consumer.commit(offsets)
        except (CommitFailedError, KafkaError) as exc:
            # Typically a rebalance in progress; the work is redone by the next owner.
            log.warning("commit failed: %s", exc, extra={"offsets": _show(offsets)})
            return
        self.offsets.committed(offsets)
        log.debug("committed", extra={"offsets": _show(offsets)})

    async def on_revoked(self, revoked: set[TopicPartition]) -> None:
        """Commit what is finished on the revoked partitions and forget their in-flight work."""
        if not revoked:
            return
        await self._commit(revoked)
        left = sum(self.offsets.in_flight(p) for p in revoked)
        self.offsets.forget(revoked)
        log.info(
            "partitions revoked",
            extra={"partitions": sorted(map(str, revoked)), "still_running": left},
        )

    async def _drain(self) -> None:
        """Let the lines on the engine finish (bounded), then abort what is left; the lines waiting
        for a place leave at once. Unfinished lines are redone."""
        if not self._tasks:
            return
        self.consumer.pause(*self.consumer.assignment())
        self.handler.stop_waiting()
        await asyncio.sleep(0)  # let the waiting lines' tasks end
        tasks = list(self._tasks)
        log.info("draining", extra={"in_flight": len(tasks), "timeout_s": self.drain_timeout_s})
        _, pending = await asyncio.wait(tasks, timeout=self.drain_timeout_s)
        if not pending:
            return
        log.warning("drain timed out; aborting", extra={"aborted": len(pending)})
        for task in pending:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*pending, return_exceptions=True)


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _show(offsets: dict[TopicPartition, int]) -> dict[str, int]:
    return {f"{tp.topic}[{tp.partition}]": offset for tp, offset in offsets.items()}
