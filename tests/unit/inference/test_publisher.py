"""The results publisher with a fake producer (it records each message and acknowledges it when
the test lets it): a batch's results that finish together go as one group, a lone result or a
reply topic's as version-1 messages, and every caller of a group hears of its fate."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiokafka.errors import KafkaTimeoutError, TopicAuthorizationFailedError

from services.inference import publisher as publisher_module
from services.inference.publisher import GROUP_MAX_BYTES, ResultPublisher, Undeliverable
from shared.protocol.messages import (
    RESULT_COUNT_HEADER,
    ResponsePayload,
    ResultMessage,
    result_count,
    result_values,
)


class FakeProducerHoldingAcks:
    """Records each message; acknowledges it once ``release`` is set (set from the start unless
    told otherwise), or fails every send with ``failure``."""

    def __init__(self, *, held: bool = False, failure: Exception | None = None) -> None:
        self.sent: list[tuple[str, bytes, bytes | None, object]] = []
        self.release = asyncio.Event()
        if not held:
            self.release.set()
        self.failure = failure
        self.first_sent = asyncio.Event()

    async def send_and_wait(
        self, topic: str, value: bytes, key: bytes | None = None, headers: object = None
    ) -> None:
        self.sent.append((topic, value, key, headers))
        self.first_sent.set()
        if self.failure is not None:
            raise self.failure
        await self.release.wait()

    def results(self, index: int) -> list[str]:
        return [json.loads(v)["custom_id"] for v in result_values(self.sent[index][1])]


def result(n: int, batch_id: str | None = "batch_1", body_bytes: int = 20) -> ResultMessage:
    body = json.dumps({"object": "chat.completion", "pad": "x" * body_bytes}).encode()
    return ResultMessage(
        request_id=f"req_{n}",
        custom_id=f"line-{n}",
        batch_id=batch_id,
        line=n,
        response=ResponsePayload(status_code=200, request_id=f"req_{n}", body=body),
    )


def publisher_for(producer: FakeProducerHoldingAcks, attempts: int = 1) -> ResultPublisher:
    return ResultPublisher(producer, attempts=attempts, retry_max_wait_s=0.01)  # type: ignore[arg-type]


async def test_results_that_finish_together_go_as_one_group() -> None:
    producer = FakeProducerHoldingAcks()
    publisher = publisher_for(producer)
    await asyncio.gather(*(publisher.publish(result(n), "results", group=True, where="") for n in range(5)))
    assert len(producer.sent) == 1
    topic, value, key, headers = producer.sent[0]
    assert topic == "results" and key == b"batch_1"
    assert json.loads(value)["schema_version"] == 2 and json.loads(value)["batch_id"] == "batch_1"
    assert producer.results(0) == [f"line-{n}" for n in range(5)]
    assert headers == [(RESULT_COUNT_HEADER, b"5")] and result_count(headers) == 5
    # Each result in the group reads back as the version-1 message it was.
    assert [ResultMessage.from_json(v) for v in result_values(value)] == [result(n) for n in range(5)]


async def test_a_lone_result_goes_at_once_as_version_1() -> None:
    producer = FakeProducerHoldingAcks()
    await publisher_for(producer).publish(result(1), "results", group=True, where="")
    ((_, value, key, headers),) = producer.sent
    assert json.loads(value)["schema_version"] == 1 and key == b"batch_1" and headers is None
    assert result_values(value) == [value]


async def test_results_finishing_while_a_group_is_sent_gather_into_the_next() -> None:
    producer = FakeProducerHoldingAcks(held=True)
    publisher = publisher_for(producer)
    first = asyncio.create_task(publisher.publish(result(0), "results", group=True, where=""))
    await producer.first_sent.wait()
    later = [
        asyncio.create_task(publisher.publish(result(n), "results", group=True, where="")) for n in (1, 2, 3)
    ]
    for _ in range(5):
        await asyncio.sleep(0)
    assert len(producer.sent) == 1 and not first.done()  # the rest wait for the first's ack
    producer.release.set()
    await asyncio.gather(first, *later)
    assert [producer.results(i) for i in range(len(producer.sent))] == [
        ["line-0"],
        ["line-1", "line-2", "line-3"],
    ]


async def test_a_reply_topic_or_another_batch_gets_its_own_messages() -> None:
    producer = FakeProducerHoldingAcks()
    publisher = publisher_for(producer)
    await asyncio.gather(
        publisher.publish(result(1), "reply", group=False, where=""),
        publisher.publish(result(2), "reply", group=False, where=""),
        publisher.publish(result(3, batch_id="batch_2"), "results", group=True, where=""),
        publisher.publish(result(4, batch_id=None), "results", group=True, where=""),
    )
    assert sorted((topic, key) for topic, _, key, _ in producer.sent) == [
        ("reply", b"batch_1"),
        ("reply", b"batch_1"),
        ("results", b"batch_2"),
        ("results", b"req_4"),
    ]
    assert all(json.loads(value)["schema_version"] == 1 for _, value, _, _ in producer.sent)


async def test_a_group_never_outgrows_its_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(publisher_module, "GROUP_MAX_RESULTS", 4)
    producer = FakeProducerHoldingAcks()
    publisher = publisher_for(producer)
    await asyncio.gather(*(publisher.publish(result(n), "results", group=True, where="") for n in range(10)))
    assert sorted(len(result_values(value)) for _, value, _, _ in producer.sent) == [2, 4, 4]
    big = GROUP_MAX_BYTES // 3
    producer.sent.clear()
    await asyncio.gather(
        *(publisher.publish(result(n, body_bytes=big), "results", group=True, where="") for n in range(3))
    )
    assert all(len(value) <= GROUP_MAX_BYTES + 1000 for _, value, _, _ in producer.sent)
    assert sum(len(result_values(value)) for _, value, _, _ in producer.sent) == 3
    assert len(producer.sent) == 2


async def test_every_caller_of_a_failed_group_gets_the_error() -> None:
    producer = FakeProducerHoldingAcks(failure=KafkaTimeoutError())
    publisher = publisher_for(producer, attempts=2)
    outcomes = await asyncio.gather(
        *(publisher.publish(result(n), "results", group=True, where="") for n in range(3)),
        return_exceptions=True,
    )
    assert all(isinstance(o, KafkaTimeoutError) for o in outcomes)
    assert len(producer.sent) == 2  # one group, tried twice


async def test_a_cancelled_caller_does_not_cancel_its_group() -> None:
    producer = FakeProducerHoldingAcks(held=True)
    publisher = publisher_for(producer)
    tasks = [
        asyncio.create_task(publisher.publish(result(n), "results", group=True, where="")) for n in range(3)
    ]
    await producer.first_sent.wait()
    tasks[0].cancel()
    producer.release.set()
    outcomes = await asyncio.gather(*tasks, return_exceptions=True)
    assert isinstance(outcomes[0], asyncio.CancelledError) and outcomes[1:] == [None, None]
    assert producer.results(0) == ["line-0", "line-1", "line-2"]


async def test_a_reply_its_topic_refuses_is_undeliverable_at_once() -> None:
    producer = FakeProducerHoldingAcks(failure=TopicAuthorizationFailedError("replies.x"))
    publisher = publisher_for(producer, attempts=5)
    with pytest.raises(Undeliverable, match="TopicAuthorizationFailedError"):
        await publisher.reply(result(1, batch_id=None), "replies.x", where="")
    assert len(producer.sent) == 1  # not tried again: another try gets the same answer


async def test_a_reply_the_broker_does_not_confirm_is_tried_again_then_raised() -> None:
    producer = FakeProducerHoldingAcks(failure=KafkaTimeoutError())
    publisher = publisher_for(producer, attempts=2)
    with pytest.raises(KafkaTimeoutError):  # an outage: the worker stops uncommitted
        await publisher.reply(result(1, batch_id=None), "replies.x", where="")
    assert len(producer.sent) == 2
