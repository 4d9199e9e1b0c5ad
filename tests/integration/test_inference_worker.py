"""The inference worker's consumer against a real Kafka-protocol broker of its own (the session's
Kafka on the real servers), with the fake engine.

Publishes request messages naming a reply topic, runs the consumer in-process, and checks one
result per request (right custom_ids, invalid and expired lines answered as such) and the
committed offsets; reads and follows the compacted control topic.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import MessageSizeTooLargeError, OutOfOrderSequenceNumber

from deploy.local import free_port
from services.api.dispatch.meter import GroupProbe, GroupReading
from services.inference.consumer import KEEPALIVE_POLL_S, RequestConsumer, make_consumer
from services.inference.control import BatchControl, ControlFollower
from services.inference.fake_engine import FakeEngine
from services.inference.handler import RequestHandler
from services.inference.settings import InferenceSettings
from shared.kafka import connection, encode, make_admin, make_producer
from shared.protocol.messages import ControlMessage, RequestMessage
from shared.settings import KafkaSettings
from shared.topics import CommitProgress, control_topic, requests_topic
from tests.support.fresh_kafka import fresh_kafka
from tests.support.private_servers import private_broker
from tests.support.real_servers import TESTCONTAINERS, on_real_servers, requested, runs_on_tansu
from tests.support.signing import api_headers
from tests.support.waiting import eventually

pytestmark = pytest.mark.second_broker
MODEL = "fake-model"


@pytest.fixture(scope="module")
def broker(request: pytest.FixtureRequest) -> Iterator[str]:
    """A broker of the module's own (the run's stand-in); on the real servers
    (``BATCHSTREAM_TEST_SERVERS=testcontainers``), the session's Kafka: each test's topics are
    fresh either way."""
    if requested() == TESTCONTAINERS:
        session = request.getfixturevalue("stand_ins")  # started first: are they the real ones?
        if on_real_servers():
            yield session.kafka_settings().bootstrap_servers
            return
    port = free_port()
    with private_broker(port):
        yield f"127.0.0.1:{port}"


@pytest.fixture
async def kafka(broker: str) -> AsyncIterator[KafkaSettings]:
    yield await fresh_kafka(broker, [MODEL])


async def _create_topic(settings: KafkaSettings, name: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.bootstrap_servers)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, 1, 1)])
    finally:
        await admin.close()


def _request(custom_id: str, reply: str, **kw: object) -> RequestMessage:
    return RequestMessage(
        request_id=f"batch_req_{custom_id}",
        custom_id=custom_id,
        url="/v1/chat/completions",
        body={"model": "anything", "messages": [{"role": "user", "content": "hello there"}]},
        reply_topic=reply,
        **kw,
    )


async def _publish(settings: KafkaSettings, reply: str) -> dict[TopicPartition, int]:
    """Publish the test's messages; returns the highest offset written per partition."""
    topic = requests_topic(settings, MODEL)
    good = [_request(f"line-{i}", reply, batch_id=f"batch_{i % 2}", line=i) for i in range(8)]
    expired = _request("late", reply, batch_id="batch_0", expires_at=1.0)
    schema_bad = {"request_id": "batch_req_bad", "custom_id": "bad", "reply_topic": reply}
    values = [encode(m) for m in [*good, expired]] + [b"not json", json.dumps(schema_bad).encode()]
    producer = make_producer(settings)
    await producer.start()
    last: dict[TopicPartition, int] = {}
    try:
        for n, value in enumerate(values):
            headers = api_headers(settings, topic, value)  # batch lines: signed as the api signs them
            meta = await producer.send_and_wait(topic, value, key=f"k{n}".encode(), headers=headers)
            tp = TopicPartition(topic, meta.partition)
            last[tp] = max(last.get(tp, -1), meta.offset)
    finally:
        await producer.stop()
    return last


async def _collect(settings: KafkaSettings, reply: str, count: int) -> list[dict]:
    consumer = AIOKafkaConsumer(
        reply, bootstrap_servers=settings.bootstrap_servers, auto_offset_reset="earliest"
    )
    await consumer.start()
    results: list[dict] = []
    try:
        async with asyncio.timeout(30):
            while len(results) < count:
                batch = await consumer.getmany(timeout_ms=200)
                results += [json.loads(r.value) for rs in batch.values() for r in rs]
    finally:
        await consumer.stop()
    return results


async def _committed(settings: KafkaSettings, group: str, tps: list[TopicPartition]) -> dict:
    probe = make_consumer(settings, group)
    await probe.start()
    try:
        return {tp: await probe.committed(tp) for tp in tps}
    finally:
        await probe.stop()


async def _worker_results(
    settings: KafkaSettings,
    consumer: AIOKafkaConsumer,
    engine: FakeEngine,
    reply: str,
    count: int,
    keepalive_poll_s: float = KEEPALIVE_POLL_S,
    **options: Any,
) -> list[dict]:
    """Run a worker on ``engine`` until ``count`` results reached ``reply``, then stop it."""
    producer = make_producer(settings)
    await producer.start()
    worker = RequestConsumer(
        consumer,
        producer,
        RequestHandler(engine),
        topic=requests_topic(settings, MODEL),
        results_topic=f"{settings.topic_prefix}results",
        settings=InferenceSettings(engine="fake", drain_timeout_s=5, **options),
        keepalive_poll_s=keepalive_poll_s,
        kafka=settings,
    )
    running = asyncio.create_task(worker.run())
    try:
        return await _collect(settings, reply, count)
    finally:
        worker.stop()
        await asyncio.wait_for(running, 15)
        await producer.stop()


async def test_one_result_per_request_and_offsets_committed(kafka: KafkaSettings) -> None:
    reply = f"{kafka.topic_prefix}replies"
    await _create_topic(kafka, reply)
    last = await _publish(kafka, reply)
    group = f"g-{uuid.uuid4().hex[:6]}"
    engine = FakeEngine(model_id=MODEL)
    # A small window, so that it fills.
    results = await _worker_results(kafka, make_consumer(kafka, group), engine, reply, 10, max_in_flight=2)

    by_id = {r["custom_id"]: r for r in results}
    assert len(results) == 10 and len(by_id) == 10
    for i in range(8):
        line = by_id[f"line-{i}"]
        assert line["response"]["status_code"] == 200 and line["error"] is None
        assert line["response"]["body"]["model"] == MODEL
        assert (line["batch_id"], line["line"]) == (f"batch_{i % 2}", i)
    assert by_id["late"]["response"] is None and by_id["late"]["error"]["code"] == "batch_expired"
    assert by_id["bad"]["error"]["code"] == "invalid_request"
    assert engine.calls == 8  # neither the expired nor the invalid lines ran

    committed = await _committed(kafka, group, list(last))
    assert committed == {tp: offset + 1 for tp, offset in last.items()}


async def test_a_window_full_longer_than_the_poll_interval_keeps_its_partitions(
    kafka: KafkaSettings,
) -> None:
    """A worker that stops polling while its engine is full still polls now and then, so the
    group keeps it: without that, Kafka drops a member that has not polled for
    ``max_poll_interval_ms`` and its unfinished lines run a second time after it rejoins."""
    reply = f"{kafka.topic_prefix}replies"
    await _create_topic(kafka, reply)
    topic = requests_topic(kafka, MODEL)
    producer = make_producer(kafka)
    await producer.start()
    try:
        for i in range(3):  # each runs 4 s, one at a time: the window stays full past the interval
            message = _request(f"slow-{i}", reply, batch_id="batch_slow", line=i + 1)
            message.body["max_tokens"] = 40
            value = encode(message)
            headers = api_headers(kafka, topic, value)
            await producer.send_and_wait(topic, value, key=b"one-partition", headers=headers)
    finally:
        await producer.stop()
    engine = FakeEngine(model_id=MODEL, seconds_per_token=0.1)
    consumer = make_consumer(kafka, f"g-{uuid.uuid4().hex[:6]}", max_poll_interval_ms=2500)
    results = await _worker_results(
        kafka, consumer, engine, reply, 3, max_in_flight=1, max_publishing=1, keepalive_poll_s=0.2
    )
    assert sorted(r["custom_id"] for r in results) == ["slow-0", "slow-1", "slow-2"]
    assert engine.calls == 3  # no line ran twice


async def test_the_control_topic_is_read_from_the_beginning_and_followed(kafka: KafkaSettings) -> None:
    topic = control_topic(kafka)
    producer = make_producer(kafka)
    await producer.start()
    cancelled: list[str] = []
    heard = asyncio.Event()

    async def on_cancel(batch_id: str) -> None:
        cancelled.append(batch_id)
        heard.set()

    async def announce(message: ControlMessage) -> None:
        await producer.send_and_wait(topic, encode(message), key=message.batch_id.encode())

    control = BatchControl()
    follower = ControlFollower.from_settings(kafka, control, on_cancel=on_cancel)
    try:
        for n in range(6):  # spread over the topic's partitions by key
            await announce(ControlMessage(batch_id=f"batch_{n}", total=2, expires_at=1e12))
        await announce(ControlMessage(batch_id="batch_0", cancelled=True))
        await follower.start(catch_up_timeout_s=10)
        assert len(control) == 6 and control.cancelled("batch_0")
        assert control.expires_at("batch_0") == 1e12 and not control.cancelled("batch_1")
        assert cancelled == []  # what was read while catching up is state, not news

        following = asyncio.create_task(follower.follow())
        await announce(ControlMessage(batch_id="batch_3", cancelled=True))
        await asyncio.wait_for(heard.wait(), 10)
        following.cancel()
        assert cancelled == ["batch_3"] and control.cancelled("batch_3")
    finally:
        await follower.stop()
        await producer.stop()


async def test_the_lines_done_past_a_commit_reach_the_dispatchers_reading(kafka: KafkaSettings) -> None:
    """One long line first on a partition holds its commit; the six short lines after it finish.
    The worker commits the long line's offset with the six counted in the commit's metadata, and
    the dispatcher's reading of the group takes them (on a broker that keeps commit metadata:
    Tansu answers "", and the six count as waiting until the aggregator has their results)."""
    reply = f"{kafka.topic_prefix}replies"
    await _create_topic(kafka, reply)
    topic = requests_topic(kafka, MODEL)
    producer = make_producer(kafka)
    await producer.start()
    first = None
    try:
        for i in range(7):
            message = _request(f"line-{i}", reply, batch_id="batch_long", line=i + 1)
            message.body["max_tokens"] = 200 if i == 0 else 1  # 0.05 s a token: 10 s, then instants
            value = encode(message)
            headers = api_headers(kafka, topic, value)
            meta = await producer.send_and_wait(topic, value, key=b"one-partition", headers=headers)
            first = meta if first is None else first
        assert first is not None
        group = f"g-{uuid.uuid4().hex[:6]}"
        worker = RequestConsumer(
            make_consumer(kafka, group),
            producer,
            RequestHandler(FakeEngine(model_id=MODEL, seconds_per_token=0.05)),
            topic=topic,
            results_topic=f"{kafka.topic_prefix}results",
            settings=InferenceSettings(engine="fake", drain_timeout_s=1),
            kafka=kafka,
        )
        running = asyncio.create_task(worker.run())
        keeps_metadata = on_real_servers() or not runs_on_tansu()  # Kafka and noida-db keep it
        probe = GroupProbe(make_admin(kafka))
        try:
            assert len(await _collect(kafka, reply, 6)) == 6  # the short lines are answered

            # On Kafka and noida-db: the long line's offset, six done past it, seven read; on Tansu: none.
            expected = {first.partition: CommitProgress(6, first.offset + 7)} if keeps_metadata else {}

            async def six_done_past() -> GroupReading | None:
                reading = await probe.read(group, topic, kafka.request_partitions)
                held = reading.committed.get(first.partition) == first.offset
                return reading if held and reading.progress == expected else None

            reading = await eventually(six_done_past, 10, "the long line's offset and six done past it")
            assert reading.committed[first.partition] == first.offset
        finally:
            worker.stop()
            await asyncio.wait_for(running, 15)
            await probe.close()
    finally:
        await producer.stop()


async def test_a_message_the_broker_refuses_stops_no_later_send_unlike_an_idempotent_producer(
    kafka: KafkaSettings,
) -> None:
    """A message the broker refuses (over the topic's ``max.message.bytes``) fails alone: the
    services' producer sends the next one to the same partition. aiokafka's idempotent producer
    (0.14) spends a batch's sequence numbers when it sends it and keeps them spent when the broker
    refuses it, so every later send to that partition fails with OutOfOrderSequenceNumber: one
    refused line would stop a dispatcher or a worker for good. Hence ``make_producer`` leaves
    idempotence off (docs/internals.md). A canary: when the last assertion fails, aiokafka has
    mended it. On Kafka and noida-db (``make test`` runs it there): Tansu refuses nothing for its
    size and answers no InitProducerId."""
    if runs_on_tansu() and not on_real_servers():
        pytest.skip("Tansu enforces no max.message.bytes")
    topic = f"{kafka.topic_prefix}small-{uuid.uuid4().hex[:6]}"
    admin = make_admin(kafka)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, 1, 1, topic_configs={"max.message.bytes": "2048"})])
    finally:
        await admin.close()
    idempotent_producer = AIOKafkaProducer(**connection(kafka), acks="all", enable_idempotence=True)
    async with make_producer(kafka) as ours, idempotent_producer as idempotent:
        for producer in (ours, idempotent):
            await producer.send_and_wait(topic, b"before", partition=0)
            with pytest.raises(MessageSizeTooLargeError):
                await producer.send_and_wait(topic, b"x" * 4096, partition=0)
        assert (await ours.send_and_wait(topic, b"after", partition=0)).offset >= 1
        with pytest.raises(OutOfOrderSequenceNumber):  # a TimeoutError here: aiokafka changed, look
            await asyncio.wait_for(idempotent.send_and_wait(topic, b"after", partition=0), 30)
