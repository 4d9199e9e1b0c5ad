"""Publishing is never assumed: results the broker does not take are published again, and a line
is committed only once its result's publish was acknowledged.

The broker is the real Tansu, behind a small Kafka-aware TCP proxy (the broker advertises the
proxy's address, so every client goes through it). While told to, the proxy drops every
connection that sends a Produce request, so publishes fail (aiokafka's own retries included)
while fetches, commits and heartbeats go on. The worker runs in-process with the fake engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Callable, Iterator

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from deploy.local import free_port
from services.inference import metrics
from services.inference.consumer import FatalConsumerError, RequestConsumer, make_consumer
from services.inference.fake_engine import FakeEngine
from services.inference.handler import RequestHandler
from services.inference.settings import InferenceSettings
from shared.kafka import encode, make_producer
from shared.protocol.messages import RequestMessage, result_values
from shared.settings import KafkaSettings
from shared.topics import requests_topic, results_topic
from tests.support.fresh_kafka import fresh_kafka
from tests.support.private_servers import private_broker
from tests.support.signing import api_headers

MODEL = "fake-model"
PRODUCE = 0  # the Kafka API key of a Produce request


class ProduceDroppingProxy:
    """Forwards Kafka connections to the broker; while ``dropping``, a connection that sends a
    Produce request is closed instead (the request never reaches the broker)."""

    def __init__(self, port: int, upstream: int) -> None:
        self.port = port
        self.upstream = upstream
        self.dropping = False
        self.dropped = 0
        self._server: asyncio.Server | None = None
        self._links: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._links):
            task.cancel()
        await asyncio.gather(*self._links, return_exceptions=True)

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._links.add(task)
        broker_r, broker_w = await asyncio.open_connection("127.0.0.1", self.upstream)
        back = asyncio.create_task(self._pipe(broker_r, client_w))
        try:
            while True:
                head = await client_r.readexactly(4)
                frame = await client_r.readexactly(int.from_bytes(head, "big"))
                if self.dropping and int.from_bytes(frame[:2], "big") == PRODUCE:
                    self.dropped += 1
                    break
                broker_w.write(head + frame)
                await broker_w.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            back.cancel()
            for writer in (client_w, broker_w):
                writer.close()
            self._links.discard(task)

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()


@pytest.fixture(scope="module")
def ports() -> Iterator[tuple[int, int]]:
    """(the proxy's port, which the broker advertises; the broker's own port)."""
    proxy, broker = free_port(), free_port()
    with private_broker(broker, advertised_port=proxy, broker="tansu"):
        yield proxy, broker


@pytest.fixture
async def proxy(ports: tuple[int, int]) -> AsyncIterator[ProduceDroppingProxy]:
    running = ProduceDroppingProxy(*ports)
    await running.start()
    try:
        yield running
    finally:
        await running.stop()


@pytest.fixture
async def kafka(proxy: ProduceDroppingProxy) -> KafkaSettings:
    return await fresh_kafka(f"127.0.0.1:{proxy.port}", [MODEL])


async def publish_requests(settings: KafkaSettings, count: int) -> dict[TopicPartition, int]:
    """``count`` request lines; returns each partition's end offset (the offset to commit)."""
    topic = requests_topic(settings, MODEL)
    producer = make_producer(settings)
    await producer.start()
    ends: dict[TopicPartition, int] = {}
    try:
        for n in range(count):
            message = RequestMessage(
                request_id=f"batch_req_{n}",
                custom_id=f"line-{n}",
                url="/v1/chat/completions",
                body={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
                batch_id="batch_publish",
                line=n + 1,
            )
            value = encode(message)
            headers = api_headers(settings, topic, value)
            meta = await producer.send_and_wait(topic, value, key=f"k{n}".encode(), headers=headers)
            tp = TopicPartition(topic, meta.partition)
            ends[tp] = max(ends.get(tp, 0), meta.offset + 1)
    finally:
        await producer.stop()
    return ends


def worker(settings: KafkaSettings, group: str, **options: object) -> tuple[RequestConsumer, object]:
    # A short produce timeout, so that a dropped publish fails in about a second.
    producer = make_producer(settings, request_timeout_ms=1000, retry_backoff_ms=50)
    consumer = RequestConsumer(
        make_consumer(settings, group),
        producer,
        RequestHandler(FakeEngine(model_id=MODEL, seconds_per_token=0.01)),
        topic=requests_topic(settings, MODEL),
        results_topic=results_topic(settings),
        settings=InferenceSettings(engine="fake", max_in_flight=4, drain_timeout_s=5, **options),  # type: ignore[arg-type]
        kafka=settings,
    )
    return consumer, producer


@contextlib.asynccontextmanager
async def running(consumer: RequestConsumer, producer: object) -> AsyncIterator[None]:
    """The worker running in this event loop; stopped (drained) and its producer closed after."""
    await producer.start()  # type: ignore[attr-defined]
    task = asyncio.create_task(consumer.run())
    try:
        yield
    finally:
        consumer.stop()
        await asyncio.wait_for(task, 30)
        await producer.stop()  # type: ignore[attr-defined]


async def results_on_topic(settings: KafkaSettings) -> list[str]:
    """The custom_id of every result the results topic holds (up to the fetch high-water mark)."""
    topic = results_topic(settings)
    consumer = AIOKafkaConsumer(bootstrap_servers=settings.bootstrap_servers, group_id=None)
    await consumer.start()
    found: list[str] = []
    try:
        partitions = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
        if not partitions:
            await consumer.force_metadata_update()
            partitions = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        async with asyncio.timeout(30):
            while True:
                for records in (await consumer.getmany(timeout_ms=300)).values():
                    found += [json.loads(v)["custom_id"] for r in records for v in result_values(r.value)]
                marks = [(await consumer.position(tp), consumer.highwater(tp)) for tp in partitions]
                if all(high is not None and position >= high for position, high in marks):
                    return found
    finally:
        await consumer.stop()


async def committed(settings: KafkaSettings, group: str, partitions: list[TopicPartition]) -> dict:
    probe = make_consumer(settings, group)
    await probe.start()
    try:
        return {tp: (await probe.committed(tp)) or 0 for tp in partitions}
    finally:
        await probe.stop()


def all_committed(consumer: RequestConsumer, ends: dict[TopicPartition, int]) -> bool:
    """The worker finished every line and committed it (as far as it knows)."""
    offsets = consumer.offsets
    return all(offsets.committable(tp) == end for tp, end in ends.items()) and not offsets.to_commit()


async def wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Poll a condition of this process's worker (its state changes in this event loop)."""
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                if condition():
                    return
                await asyncio.sleep(0.05)
    except TimeoutError:
        raise AssertionError(f"timed out after {timeout_s:g}s waiting for {what}") from None


async def test_a_refused_publish_is_retried_and_every_line_is_published(
    kafka: KafkaSettings, proxy: ProduceDroppingProxy
) -> None:
    lines = 20
    ends = await publish_requests(kafka, lines)
    group = f"g-{uuid.uuid4().hex[:6]}"
    retries = metrics.PUBLISH_RETRIES._value.get()
    proxy.dropping = True
    consumer, producer = worker(kafka, group, publish_attempts=20, publish_retry_max_wait_s=0.5)
    async with running(consumer, producer):
        # The witness: the worker saw a publish fail and is trying it again.
        await wait_for(lambda: metrics.PUBLISH_RETRIES._value.get() > retries, 60, "a publish retry")
        proxy.dropping = False
        await wait_for(lambda: all_committed(consumer, ends), 60, "every line committed")
    assert proxy.dropped > 0
    published = await results_on_topic(kafka)
    assert set(published) == {f"line-{n}" for n in range(lines)}  # every line, duplicates allowed
    assert await committed(kafka, group, list(ends)) == ends


async def test_a_publish_that_keeps_failing_stops_the_worker_without_committing_the_line(
    kafka: KafkaSettings, proxy: ProduceDroppingProxy
) -> None:
    lines = 10
    ends = await publish_requests(kafka, lines)
    group = f"g-{uuid.uuid4().hex[:6]}"
    failures = metrics.PUBLISH_FAILURES._value.get()
    proxy.dropping = True
    first, producer = worker(kafka, group, publish_attempts=2, publish_retry_max_wait_s=0.1)
    await producer.start()  # type: ignore[attr-defined]
    try:
        with pytest.raises(FatalConsumerError):
            await asyncio.wait_for(first.run(), 120)
    finally:
        await producer.stop()  # type: ignore[attr-defined]
    assert metrics.PUBLISH_FAILURES._value.get() > failures
    published = set(await results_on_topic(kafka))
    assert len(published) < lines
    # Nothing without a published result was committed: the next owner runs those lines again.
    done = await committed(kafka, group, list(ends))
    assert sum(done.values()) <= len(published) and done != ends

    proxy.dropping = False
    second, producer = worker(kafka, group)
    async with running(second, producer):
        await wait_for(lambda: all_committed(second, ends), 60, "the uncommitted lines run again")
    assert set(await results_on_topic(kafka)) == {f"line-{n}" for n in range(lines)}
    assert await committed(kafka, group, list(ends)) == ends


async def test_results_waiting_for_the_broker_do_not_hold_the_engines_places(
    kafka: KafkaSettings, proxy: ProduceDroppingProxy
) -> None:
    """While no publish is acknowledged the engine still gets new requests (up to the bound on
    requests held in all), never more than its window at once; then every line is published."""
    lines, window, publishing = 40, 4, 12
    ends = await publish_requests(kafka, lines)
    group = f"g-{uuid.uuid4().hex[:6]}"
    started, peak = _started(), 0.0
    proxy.dropping = True
    consumer, producer = worker(
        kafka, group, publish_attempts=50, publish_retry_max_wait_s=0.5, max_publishing=publishing
    )

    async def watch_in_flight() -> None:
        """The gauge as a scrape reads it, sampled often: a fake-engine line is on it for ~20 ms,
        shorter than ``wait_for``'s polls (CI once saw 16 lines start with none sampled)."""
        nonlocal peak
        while True:
            peak = max(peak, metrics.IN_FLIGHT.collect()[0].samples[0].value)
            await asyncio.sleep(0.002)

    async with running(consumer, producer):
        watcher = asyncio.create_task(watch_in_flight())
        try:
            await wait_for(
                lambda: _started() - started >= window + publishing,
                60,
                "the engine fed while nothing is acknowledged",
            )
        finally:
            watcher.cancel()
        assert not set(await results_on_topic(kafka)) & {f"line-{n}" for n in range(lines)}
        await asyncio.sleep(0.5)  # the worker's held requests are bounded: no more start meanwhile
        assert _started() - started == window + publishing
        proxy.dropping = False
        await wait_for(lambda: all_committed(consumer, ends), 60, "every line committed")
    assert 0 < peak <= window
    assert set(await results_on_topic(kafka)) == {f"line-{n}" for n in range(lines)}


def _started() -> float:
    """Requests handed to the engine so far, as a ``/metrics`` scrape reads them."""
    metrics.LINES.flush()
    return metrics.STARTED._value.get()
