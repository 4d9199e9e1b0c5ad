"""Batch facts from the compacted control topic, held in memory: no database call per line.

Every worker reads the whole control topic (all partitions, no consumer group, from the
beginning) and then follows it. ``BatchControl`` is the pure map ``batch_id -> (cancelled,
expires_at)``; ``ControlFollower`` feeds it from Kafka and tells a listener when a batch becomes
cancelled, so in-flight requests of that batch can be aborted.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

from shared.kafka import connection, decode
from shared.protocol.messages import ControlMessage
from shared.protocol.wire import convert
from shared.settings import KafkaSettings
from shared.topics import control_topic

log = logging.getLogger(__name__)

# Facts about a batch whose deadline passed this long ago are dropped (its lines expire anyway,
# as every request message carries the deadline).
FORGET_AFTER_S = 24 * 3600.0
POLL_TIMEOUT_MS = 200


@dataclass
class BatchFacts:
    cancelled: bool = False
    expires_at: float | None = None


class BatchControl:
    """What the worker knows about each batch. A cancellation is final."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._facts: dict[str, BatchFacts] = {}
        self.clock = clock

    def __len__(self) -> int:
        return len(self._facts)

    def apply(self, message: ControlMessage) -> bool:
        """Merge one control message; True when it newly cancels its batch.

        Later messages only add facts: a field left unset keeps what an earlier message said
        (the api's cancel message names no deadline), and nothing un-cancels a batch.
        """
        facts = self._facts.setdefault(message.batch_id, BatchFacts())
        if message.expires_at is not None:
            facts.expires_at = message.expires_at
        newly = message.cancelled and not facts.cancelled
        facts.cancelled = facts.cancelled or message.cancelled
        return newly

    def forget(self, batch_id: str) -> None:
        """A tombstone (null value) on the compacted topic: the batch's facts are gone."""
        self._facts.pop(batch_id, None)

    def cancelled(self, batch_id: str | None) -> bool:
        facts = self._facts.get(batch_id) if batch_id else None
        return facts is not None and facts.cancelled

    def expires_at(self, batch_id: str | None) -> float | None:
        facts = self._facts.get(batch_id) if batch_id else None
        return facts.expires_at if facts is not None else None

    def prune(self) -> int:
        """Drop batches whose deadline passed long ago; returns how many."""
        horizon = self.clock() - FORGET_AFTER_S
        old = [b for b, f in self._facts.items() if f.expires_at is not None and f.expires_at < horizon]
        for batch_id in old:
            del self._facts[batch_id]
        return len(old)


CancelListener = Callable[[str], Awaitable[None]]


class ControlFollower:
    """Reads the control topic from the beginning into ``control`` and keeps following it."""

    def __init__(
        self,
        consumer: AIOKafkaConsumer,
        topic: str,
        control: BatchControl,
        on_cancel: CancelListener | None = None,
    ) -> None:
        self.consumer = consumer
        self.topic = topic
        self.control = control
        self.on_cancel = on_cancel
        self._partitions: list[TopicPartition] = []
        self._caught_up = asyncio.Event()
        self._last_prune = time.monotonic()

    @classmethod
    def from_settings(
        cls, kafka: KafkaSettings, control: BatchControl, on_cancel: CancelListener | None = None
    ) -> ControlFollower:
        consumer = AIOKafkaConsumer(
            **connection(kafka),
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
        )
        return cls(consumer, control_topic(kafka), control, on_cancel)

    async def start(self, catch_up_timeout_s: float = 30.0) -> None:
        """Assign every partition from the beginning and read up to the end (bounded wait)."""
        await self.consumer.start()
        partitions = self.consumer.partitions_for_topic(self.topic)
        if not partitions:
            await self.consumer.force_metadata_update()
            partitions = self.consumer.partitions_for_topic(self.topic) or set()
        self._partitions = [TopicPartition(self.topic, p) for p in sorted(partitions)]
        self.consumer.assign(self._partitions)
        await self.consumer.seek_to_beginning(*self._partitions)
        deadline = time.monotonic() + catch_up_timeout_s
        while not await self._at_end():
            if time.monotonic() > deadline:
                log.warning(
                    "control topic not read to its end in time; going on", extra={"topic": self.topic}
                )
                break
            await self.poll()
        self._caught_up.set()
        log.info("control topic read", extra={"topic": self.topic, "batches": len(self.control)})

    async def _at_end(self) -> bool:
        """Every partition's position has reached its high-water mark (known after a fetch).

        The fetch high-water mark is used rather than ``end_offsets()``: some Kafka-protocol
        brokers answer ListOffsets LATEST wrongly, every broker gets the fetch response right.
        """
        for tp in self._partitions:
            highwater = self.consumer.highwater(tp)
            if highwater is None:
                return False
            if await self.consumer.position(tp) < highwater:
                return False
        return True

    async def poll(self) -> None:
        batch = await self.consumer.getmany(*self._partitions, timeout_ms=POLL_TIMEOUT_MS)
        for records in batch.values():
            for record in records:
                await self._apply(
                    record.key, record.value, f"{record.topic}[{record.partition}]@{record.offset}"
                )
        if time.monotonic() - self._last_prune > 600:
            self._last_prune = time.monotonic()
            self.control.prune()

    async def _apply(self, key: bytes | None, value: bytes | None, where: str) -> None:
        if value is None:
            if key:
                self.control.forget(key.decode(errors="replace"))
            return
        try:
            message = convert(decode(value), ControlMessage)
        except ValueError as exc:  # not JSON, or not a control message (msgspec.ValidationError)
            log.warning("skipping an invalid control message: %s", exc, extra={"at": where})
            return
        if self.control.apply(message):
            log.info("batch cancelled", extra={"batch_id": message.batch_id, "at": where})
            if self.on_cancel is not None and self._caught_up.is_set():
                await self.on_cancel(message.batch_id)

    async def follow(self) -> None:
        """Keep reading until cancelled; a broker hiccup only logs."""
        while True:
            try:
                await self.poll()
            except KafkaError as exc:
                log.warning("reading the control topic failed: %s", exc, extra={"topic": self.topic})
                await asyncio.sleep(1.0)

    async def stop(self) -> None:
        await self.consumer.stop()
