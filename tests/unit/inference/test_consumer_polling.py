"""How the worker polls while its window is full, against a fake Kafka consumer that records polls.

aiokafka drops the records it fetched for a paused partition, so a worker that polled paused
partitions at every wake-up fetched and decoded them again after each resume. A full window
must not poll, except a keep-alive every ``keepalive_poll_s``; and a poll takes no more requests
than the window has room for.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiokafka import TopicPartition
from aiokafka.structs import ConsumerRecord

from services.inference.consumer import RequestConsumer, interleaved
from services.inference.fake_engine import FakeEngine
from services.inference.handler import RequestHandler
from services.inference.settings import InferenceSettings
from shared.kafka import encode
from shared.protocol.messages import RequestMessage, result_values

PARTITION = TopicPartition("requests.fake-model", 0)


class FakeConsumerRecordingPolls:
    """Hands out the given records and records each ``getmany``: (max_records, paused then)."""

    def __init__(self, values: list[bytes]) -> None:
        self.records = [
            ConsumerRecord(PARTITION.topic, 0, n, 0, 0, None, value, None, 0, len(value), ())
            for n, value in enumerate(values)
        ]
        self.polls: list[tuple[int | None, bool]] = []
        self._paused: set[TopicPartition] = set()

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def subscribe(self, topics: list[str], listener: Any) -> None: ...

    def assignment(self) -> set[TopicPartition]:
        return {PARTITION}

    def pause(self, *partitions: TopicPartition) -> None:
        self._paused |= set(partitions)

    def resume(self, *partitions: TopicPartition) -> None:
        self._paused -= set(partitions)

    def paused(self) -> set[TopicPartition]:
        return set(self._paused)

    async def getmany(self, timeout_ms: int = 0, max_records: int | None = None) -> dict[Any, Any]:
        self.polls.append((max_records, bool(self._paused)))
        if self._paused or not self.records:
            await asyncio.sleep(timeout_ms / 1000)
            return {}
        count = max_records or len(self.records)
        taken, self.records = self.records[:count], self.records[count:]
        return {PARTITION: taken}

    async def commit(self, offsets: dict[TopicPartition, int]) -> None: ...


class FakeProducerAcking:
    """Acknowledges every publish at once; ``all_sent`` is set after ``expected`` of them."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.sent: list[bytes] = []
        self.all_sent = asyncio.Event()

    async def send_and_wait(
        self, topic: str, value: bytes, key: bytes | None = None, headers: object = None
    ) -> None:
        self.sent += result_values(value)
        if len(self.sent) >= self.expected:
            self.all_sent.set()


def _requests(count: int, max_tokens: int) -> list[bytes]:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens}
    return [
        encode(
            RequestMessage(
                request_id=f"r{n}",
                custom_id=f"c{n}",
                url="/v1/chat/completions",
                body=body,
                reply_topic="replies",
            )
        )
        for n in range(count)
    ]


async def _run(consumer: FakeConsumerRecordingPolls, keepalive_poll_s: float, count: int) -> None:
    producer = FakeProducerAcking(count)
    worker = RequestConsumer(
        consumer,  # type: ignore[arg-type]
        producer,  # type: ignore[arg-type]
        RequestHandler(FakeEngine(seconds_per_token=0.05)),  # 10 tokens: 0.5 s per request
        topic=PARTITION.topic,
        results_topic="results",
        settings=InferenceSettings(engine="fake", max_in_flight=2, max_publishing=1),
        keepalive_poll_s=keepalive_poll_s,
    )
    running = asyncio.create_task(worker.run())
    async with asyncio.timeout(20):
        await producer.all_sent.wait()
    worker.stop()
    await running


async def test_a_full_window_does_not_poll_until_a_place_frees() -> None:
    consumer = FakeConsumerRecordingPolls(_requests(6, max_tokens=10))
    await _run(consumer, keepalive_poll_s=30.0, count=6)
    assert consumer.polls, "the worker never polled"
    assert not any(paused for _, paused in consumer.polls), "polled with its partitions paused"
    # Two places: after the first poll filled them, each poll asks for what just freed.
    assert consumer.polls[0][0] == 2 and all(1 <= (n or 0) <= 2 for n, _ in consumer.polls)


async def test_a_window_that_stays_full_still_polls_paused_now_and_then() -> None:
    consumer = FakeConsumerRecordingPolls(_requests(2, max_tokens=20))  # 1 s each, both at once
    await _run(consumer, keepalive_poll_s=0.2, count=2)
    keepalives = [n for n, paused in consumer.polls if paused]
    assert 2 <= len(keepalives) <= 10  # ~every 0.2 s of the second the window was full


def test_a_polls_partitions_are_taken_in_turn_each_in_its_order() -> None:
    # The dispatcher spread its first lines (a, b, c, ...) over two partitions: the poll returns
    # each partition's records together; they start about in the order they were sent.
    batch = {"p0": ["a", "c", "e", "f"], "p1": ["b", "d"], "p2": []}
    assert list(interleaved(batch)) == [
        ("p0", "a"),
        ("p1", "b"),
        ("p0", "c"),
        ("p1", "d"),
        ("p0", "e"),
        ("p0", "f"),
    ]
