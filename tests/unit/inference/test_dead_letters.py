"""A reply its topic refuses becomes a dead letter, and a batch result too large for the broker an
error line, and the worker goes on; the reply-topic probe asks the broker once per topic and
remembers the answer a while (fake consumer, producer, handler, admin and clock)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any

from aiokafka import TopicPartition
from aiokafka.errors import KafkaConnectionError, MessageSizeTooLargeError, TopicAuthorizationFailedError
from aiokafka.structs import ConsumerRecord, OffsetAndMetadata

from services.inference.consumer import RequestConsumer
from services.inference.fake_engine import FakeEngine
from services.inference.handler import RequestHandler
from services.inference.intake import FOUND_FOR_S, MISSING_FOR_S, ReplyTopicProbe
from services.inference.settings import InferenceSettings
from shared.kafka import encode
from shared.protocol.messages import RequestMessage, ResponsePayload, ResultMessage
from shared.request_signing import RequestSigner
from shared.settings import KafkaSettings

PARTITION = TopicPartition("requests.fake-model", 0)


class FakeConsumer:
    """Hands out the given records once; records what is committed."""

    def __init__(self, values: list[bytes]) -> None:
        self.records = [
            ConsumerRecord(PARTITION.topic, 0, n, 0, 0, None, v, None, 0, len(v), ())
            for n, v in enumerate(values)
        ]
        self.committed: dict[TopicPartition, int] = {}
        self.all_committed = asyncio.Event()
        self.handed_out = 0

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def subscribe(self, topics: list[str], listener: Any) -> None: ...

    def assignment(self) -> set[TopicPartition]:
        return {PARTITION}

    def pause(self, *partitions: TopicPartition) -> None: ...

    def resume(self, *partitions: TopicPartition) -> None: ...

    def paused(self) -> set[TopicPartition]:
        return set()

    async def getmany(self, timeout_ms: int = 0, max_records: int | None = None) -> dict[Any, Any]:
        if not self.records:
            await asyncio.sleep(timeout_ms / 1000)
            return {}
        taken, self.records = self.records, []
        self.handed_out = len(taken)
        return {PARTITION: taken}

    async def commit(self, offsets: dict[TopicPartition, OffsetAndMetadata]) -> None:
        self.committed.update({tp: meta.offset for tp, meta in offsets.items()})
        if not self.records and self.committed.get(PARTITION, 0) >= self.handed_out:
            self.all_committed.set()


class FakeProducerRefusingOneTopic:
    """Acknowledges every send but those to ``refused``, which the broker does not authorise."""

    def __init__(self, refused: str) -> None:
        self.refused = refused
        self.sent: list[tuple[str, bytes]] = []

    async def send_and_wait(
        self, topic: str, value: bytes, key: bytes | None = None, headers: object = None
    ) -> None:
        if topic == self.refused:
            raise TopicAuthorizationFailedError(topic)
        self.sent.append((topic, value))


def pipeline_request(request_id: str, reply_topic: str) -> bytes:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    message = RequestMessage(
        request_id=request_id,
        custom_id=request_id,
        url="/v1/chat/completions",
        body=body,
        reply_topic=reply_topic,
    )
    return encode(message)


async def test_a_reply_its_topic_refuses_is_dead_lettered_and_committed() -> None:
    consumer = FakeConsumer(
        [pipeline_request("locked", "replies.locked"), pipeline_request("ok", "replies.ok")]
    )
    producer = FakeProducerRefusingOneTopic("replies.locked")
    worker = RequestConsumer(
        consumer,  # type: ignore[arg-type]
        producer,  # type: ignore[arg-type]
        RequestHandler(FakeEngine()),
        topic=PARTITION.topic,
        results_topic="results",
        settings=InferenceSettings(engine="fake", max_in_flight=4, publish_attempts=5),
        kafka=KafkaSettings(),
    )
    running = asyncio.create_task(worker.run())
    async with asyncio.timeout(10):
        await consumer.all_committed.wait()
    worker.stop()
    await running  # no FatalConsumerError: the worker was never stopping
    assert consumer.committed == {PARTITION: 2}  # both offsets, the dead-lettered one too

    by_topic = {topic: json.loads(value) for topic, value in producer.sent}
    assert set(by_topic) == {"replies.ok", "dead-letters"}
    letter = by_topic["dead-letters"]
    assert (letter["reason"], letter["request_id"], letter["offset"]) == ("reply_undeliverable", "locked", 0)
    assert "TopicAuthorizationFailedError" in letter["detail"] and letter["reply_topic"] == "replies.locked"


class FakeAdmin:
    """Answers ``describe_topics`` from ``codes`` (topic -> Kafka error code), counting requests;
    raises ``failure`` instead when set."""

    def __init__(self, codes: dict[str, int]) -> None:
        self.codes = codes
        self.asked: list[str] = []
        self.failure: Exception | None = None

    async def describe_topics(self, topics: list[str] | None = None) -> list[Any]:
        assert topics is not None
        self.asked += topics
        await asyncio.sleep(0)
        if self.failure is not None:
            raise self.failure
        return [{"topic": t, "error_code": self.codes.get(t, 3), "partitions": []} for t in topics]

    async def close(self) -> None: ...


async def test_the_probe_asks_once_per_topic_and_remembers_a_while() -> None:
    now = [0.0]
    admin = FakeAdmin({"replies.ok": 0, "replies.creating": 5})
    probe = ReplyTopicProbe(KafkaSettings(), clock=lambda: now[0], admin=admin)

    answers = await asyncio.gather(*(probe.problem("replies.ok") for _ in range(5)))
    assert answers == [None] * 5 and admin.asked == ["replies.ok"]  # asked at once: one request
    assert await probe.problem("replies.missing") == "UnknownTopicOrPartitionError"
    assert await probe.problem("replies.creating") is None  # leader not yet elected: it is coming
    assert await probe.problem("replies.missing") == "UnknownTopicOrPartitionError"
    assert admin.asked.count("replies.missing") == 1

    now[0] = MISSING_FOR_S + 1  # a missing topic may have been created since
    admin.codes["replies.missing"] = 0
    assert await probe.problem("replies.missing") is None
    assert await probe.problem("replies.ok") is None and admin.asked.count("replies.ok") == 1
    now[0] = FOUND_FOR_S + 1
    await probe.problem("replies.ok")
    assert admin.asked.count("replies.ok") == 2


async def test_a_broker_that_cannot_be_asked_is_no_answer() -> None:
    admin = FakeAdmin({})
    admin.failure = KafkaConnectionError()
    probe = ReplyTopicProbe(KafkaSettings(), admin=admin)
    assert await probe.problem("replies.x") is None  # the send decides (an outage stops the worker)
    admin.failure = None
    assert await probe.problem("replies.x") == "UnknownTopicOrPartitionError"  # nothing remembered


class FakeHandlerAnsweringLarge:
    """Answers every request with a body of ``size`` bytes, without an engine."""

    def __init__(self, size: int) -> None:
        self.size = size

    async def handle(self, message: Any) -> ResultMessage:
        body = json.dumps({"object": "chat.completion", "pad": "x" * self.size}).encode()
        return ResultMessage(
            request_id=message.request_id,
            custom_id=message.custom_id,
            batch_id=message.batch_id,
            line=message.line,
            response=ResponsePayload(status_code=200, request_id="req_1", body=body),
        )

    def stop_waiting(self) -> None: ...


class FakeProducerWithALimit:
    """Refuses a message over ``limit`` bytes as a broker does (``message.max.bytes``)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.tries = 0
        self.sent: list[tuple[str, bytes]] = []

    async def send_and_wait(
        self, topic: str, value: bytes, key: bytes | None = None, headers: object = None
    ) -> None:
        self.tries += 1
        if len(value) > self.limit:
            raise MessageSizeTooLargeError()
        self.sent.append((topic, value))


async def test_a_batch_result_too_large_for_the_broker_becomes_an_error_line() -> None:
    settings = KafkaSettings()
    body = {"messages": [{"role": "user", "content": "hi"}]}
    value = encode(
        RequestMessage(
            request_id="batch_req_1",
            custom_id="c1",
            url="/v1/chat/completions",
            body=body,
            batch_id="b",
            line=1,
        )
    )
    consumer = FakeConsumer([value])
    consumer.records[0] = dataclasses.replace(
        consumer.records[0],
        headers=tuple(RequestSigner(settings.signing_key).headers(PARTITION.topic, value)),
    )
    producer = FakeProducerWithALimit(limit=1024 * 1024)
    worker = RequestConsumer(
        consumer,  # type: ignore[arg-type]
        producer,  # type: ignore[arg-type]
        FakeHandlerAnsweringLarge(2 * 1024 * 1024),  # type: ignore[arg-type]
        topic=PARTITION.topic,
        results_topic="results",
        settings=InferenceSettings(engine="fake", max_in_flight=4, publish_attempts=5),
        kafka=settings,
    )
    running = asyncio.create_task(worker.run())
    async with asyncio.timeout(10):
        await consumer.all_committed.wait()
    worker.stop()
    await running

    assert consumer.committed == {PARTITION: 1} and producer.tries == 2  # no retry of the refusal
    ((topic, sent),) = producer.sent
    line = json.loads(sent)
    assert topic == "results" and (line["batch_id"], line["line"], line["response"]) == ("b", 1, None)
    assert line["error"]["code"] == "result_too_large"
