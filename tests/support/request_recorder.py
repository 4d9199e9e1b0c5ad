"""A stand-in for a model's workers that records the order the dispatcher sends lines in.

``RequestRecorder`` joins the model's workers' consumer group, reads the model's requests topic and
commits what it read (the dispatcher meters by the group's committed backlog, so it keeps sending),
but runs and answers nothing. It keeps each line's first send: a line sent again (the dispatcher
resends a line that never got a result) counts once, at its earliest record.

    async with RequestRecorder(stack.kafka_settings(), model) as recorder:
        await recorder.until(lambda: recorder.count(batch.id) >= lines, 60)
    recorder.order()  # every line's first send, in send order
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType

from aiokafka import AIOKafkaConsumer, ConsumerRecord

from shared.settings import KafkaSettings
from shared.topics import inference_group, requests_topic


@dataclass(frozen=True)
class Sent:
    """One line's first send: its request message's batch and line, and where the record stands."""

    batch_id: str
    line: int
    partition: int
    offset: int
    timestamp_ms: int


class RequestRecorder:
    """A member of the model's workers' group that commits every request and records its first send."""

    def __init__(self, kafka: KafkaSettings, model: str) -> None:
        self._consumer = AIOKafkaConsumer(
            requests_topic(kafka, model),
            bootstrap_servers=kafka.bootstrap_servers,
            group_id=inference_group(kafka, model),
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_poll_records=50,
        )
        self._first: dict[tuple[str, int], Sent] = {}

    async def __aenter__(self) -> RequestRecorder:
        await self._consumer.start()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._consumer.stop()

    async def poll(self) -> None:
        """Record what arrives within 200 ms (at most 50 records), then commit it."""
        got = await self._consumer.getmany(timeout_ms=200, max_records=50)
        for partition, records in got.items():
            for record in records:
                self._record(partition.partition, record)
        await self._consumer.commit()

    async def until(self, done: Callable[[], bool], timeout_s: float) -> bool:
        """Poll until ``done()`` holds or ``timeout_s`` has passed; whether it holds."""
        deadline = time.monotonic() + timeout_s
        while not done() and time.monotonic() < deadline:
            await self.poll()
        return done()

    def count(self, *batch_ids: str) -> int:
        """How many distinct lines of these batches were sent."""
        return sum(sent.batch_id in batch_ids for sent in self._first.values())

    def order(self) -> list[Sent]:
        """Every line's first send, in send order (record time; ties by line)."""
        return sorted(self._first.values(), key=lambda sent: (sent.timestamp_ms, sent.line))

    def by_partition(self) -> dict[int, list[str]]:
        """Per partition, the batch id of each line first sent there, in offset order."""
        order: dict[int, list[str]] = {}
        for sent in sorted(self._first.values(), key=lambda sent: (sent.partition, sent.offset)):
            order.setdefault(sent.partition, []).append(sent.batch_id)
        return order

    def _record(self, partition: int, record: ConsumerRecord[bytes, bytes]) -> None:
        message = json.loads(record.value or b"{}")
        key = (message["batch_id"], message["line"])
        known = self._first.get(key)
        if known is None or record.timestamp < known.timestamp_ms:
            self._first[key] = Sent(key[0], key[1], partition, record.offset, record.timestamp)
