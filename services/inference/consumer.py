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

Before a message runs, ``intake.py`` judges it (the api's signature on a batch line, a pipeline's
reply topic); a message that can be neither run nor answered, and a reply its topic refuses, go to
the dead-letter topic, and their offsets commit like any other.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterator, Mapping
from typing import Any, TypeVar

import msgspec
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka.abc import ConsumerRebalanceListener
from aiokafka.errors import CommitFailedError, KafkaError
from aiokafka.structs import OffsetAndMetadata

from services.inference import metrics
from services.inference.handler import RequestHandler
from services.inference.intake import Publish, Refusal, ReplyTopicProbe, RequestIntake, Run, echo
from services.inference.offsets import OffsetTracker
from services.inference.publisher import ResultPublisher, Undeliverable
from services.inference.settings import InferenceSettings, worker_defaults
from shared.kafka import connection
from shared.protocol.messages import (
    RESULT_TOO_LARGE_CODE,
    RESULT_TOO_LARGE_MESSAGE,
    LineError,
)
from shared.settings import AggregatorSettings, KafkaSettings
from shared.topics import (
    CommitProgress,
    dead_letters_topic,
    inference_group,
    requests_topic,
    results_topic,
)

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

P = TypeVar("P")
R = TypeVar("R")


def interleaved(batch: Mapping[P, list[R]]) -> Iterator[tuple[P, R]]:
    """A poll's records one partition after another in turn (each partition's in its order).

    The dispatcher spreads a batch's lines over the partitions in its dispatch order (longest
    first), and a poll returns each partition's records together: taken partition by partition,
    the first lines of the second partition would go onto the engine after every line of the
    first, and wait inside it behind them: a batch's long lines, sent first, would start behind
    the short lines of the same poll and end last."""
    rows = [(partition, records) for partition, records in batch.items() if records]
    for at in range(max((len(records) for _, records in rows), default=0)):
        for partition, records in rows:
            if at < len(records):
                yield partition, records[at]


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
        settings: InferenceSettings | None = None,
        keepalive_poll_s: float = KEEPALIVE_POLL_S,
        kafka: KafkaSettings | None = None,
        reply_probe: ReplyTopicProbe | None = None,
    ) -> None:
        """The window, publishing, draining and commits as ``settings`` say (without settings,
        their defaults)."""
        settings = settings if settings is not None else worker_defaults()
        self.consumer = consumer
        self.producer = producer
        self.handler = handler
        self.topic = topic
        self.results_topic = results_topic
        self.in_flight_limit = max(1, settings.in_flight_limit)
        self.max_publishing = max(1, settings.max_publishing)
        self.drain_timeout_s = settings.drain_timeout_s
        self.publisher = ResultPublisher(
            producer, attempts=settings.publish_attempts, retry_max_wait_s=settings.publish_retry_max_wait_s
        )
        self.commit_interval_s = settings.commit_interval_s
        self.commit_done_past = settings.commit_done_past
        self.keepalive_poll_s = keepalive_poll_s
        kafka = kafka if kafka is not None else KafkaSettings()
        self.intake = RequestIntake.from_settings(kafka, AggregatorSettings())
        self.dead_letters_topic = dead_letters_topic(kafka)
        self.reply_probe = reply_probe
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
            settings=inference,
            kafka=kafka,
            reply_probe=ReplyTopicProbe(kafka),
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
            if self.reply_probe is not None:
                await self.reply_probe.close()
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
        for partition, record in interleaved(batch):
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
            outcome = await self._outcome(record, where)
        finally:
            self._left_engine(asyncio.current_task())
        if isinstance(outcome, Refusal):
            await self._dead_letter(record, outcome, where)
        elif outcome.reply_topic is None:
            try:
                await self.publisher.publish(outcome.result, self.results_topic, group=True, where=where)
            except Undeliverable as exc:  # too large for the broker: the line becomes an error line
                log.warning("a result is too large for the broker: %s", exc, extra={"at": where})
                error = LineError(
                    code=RESULT_TOO_LARGE_CODE, message=RESULT_TOO_LARGE_MESSAGE.format(detail=exc)
                )
                failed = msgspec.structs.replace(outcome.result, response=None, usage=None, error=error)
                await self.publisher.publish(failed, self.results_topic, group=True, where=where)
        else:
            try:
                await self.publisher.reply(outcome.result, outcome.reply_topic, where=where)
            except Undeliverable as exc:
                refusal = Refusal(
                    "reply_undeliverable", str(exc), outcome.result.request_id, outcome.reply_topic
                )
                await self._dead_letter(record, refusal, where)
        self.offsets.finish(partition, record.offset, epoch)

    async def _outcome(self, record: ConsumerRecord[Any, Any], where: str) -> Publish | Refusal:
        """The message's answer (run on the engine when the intake says so), or its refusal."""
        verdict = self.intake.judge(record)
        if isinstance(verdict, Refusal):
            return verdict
        if verdict.reply_topic is not None and self.reply_probe is not None:
            problem = await self.reply_probe.problem(verdict.reply_topic)
            if problem is not None:  # refused before any engine time is spent on it
                request_id = (
                    verdict.message.request_id if isinstance(verdict, Run) else verdict.result.request_id
                )
                return Refusal("reply_undeliverable", problem, request_id, verdict.reply_topic)
        if isinstance(verdict, Publish):
            return verdict
        message = verdict.message
        if log.isEnabledFor(logging.DEBUG):
            context = {"batch_id": message.batch_id, "custom_id": message.custom_id, "at": where}
            log.debug("running request", extra=context)
        return Publish(await self.handler.handle(message), verdict.reply_topic)

    async def _dead_letter(self, record: ConsumerRecord[Any, Any], refusal: Refusal, where: str) -> None:
        metrics.DEAD_LETTERS.labels(reason=refusal.reason).inc()
        log.warning(
            "dead-lettering a request message: %s (%s)",
            refusal.reason,
            refusal.detail,
            extra={"at": where, "request_id": echo(refusal.request_id)},
        )
        await self.publisher.dead_letter(refusal.letter(record), self.dead_letters_topic, where=where)

    async def _commit(self, partitions: set[TopicPartition] | None = None) -> None:
        self._last_commit = time.monotonic()
        offsets = self.offsets.to_commit(partitions)
        if not offsets:
            return
        try:
            await self.consumer.commit(
                {
                    tp: OffsetAndMetadata(offset, self._metadata(done))
                    for tp, (offset, done) in offsets.items()
                }
            )
        except (CommitFailedError, KafkaError) as exc:
            # Typically a rebalance in progress; the work is redone by the next owner.
            log.warning("commit failed: %s", exc, extra={"offsets": _show(offsets)})
            return
        self.offsets.committed(offsets)
        log.debug("committed", extra={"offsets": _show(offsets)})

    def _metadata(self, progress: CommitProgress) -> str:
        """The commit's metadata: the lines done past its offset (``commit_done_past``)."""
        return progress.encode() if self.commit_done_past else ""

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


def _show(offsets: dict[TopicPartition, tuple[int, CommitProgress]]) -> dict[str, int]:
    return {f"{tp.topic}[{tp.partition}]": offset for tp, (offset, _) in offsets.items()}
