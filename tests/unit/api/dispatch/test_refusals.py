"""A line the producer or the broker refuses for good is that line's error result and the round
goes on; a failure that a retry may mend (the broker unreachable) still fails the send."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

import pytest
from aiokafka.errors import KafkaConnectionError, MessageSizeTooLargeError
from aiokafka.producer.message_accumulator import BatchBuilder

from services.api.dispatch.sender import LineSender, Refused, RequestRound
from services.api.dispatch.state import QueuedState
from shared.input_lines import InputLine
from shared.kafka import decode
from shared.protocol.messages import SamplingDefaults
from shared.protocol.result_message import UNDELIVERABLE_CODE
from shared.request_signing import RequestSigner
from shared.settings import KafkaSettings
from shared.stores.dispatcher import Position


@dataclass
class Acked:
    offset: int


class HeaderRecordingBuilder(BatchBuilder):  # type: ignore[misc]
    """aiokafka's record batch builder, remembering each record's value and headers."""

    def __init__(self) -> None:
        super().__init__(1024 * 1024, 0)
        self.records: list[tuple[bytes, list[tuple[str, bytes]]]] = []

    def append(self, *, timestamp: Any, key: Any, value: bytes, headers: Any = ()) -> Any:
        placed = super().append(timestamp=timestamp, key=key, value=value, headers=list(headers))
        if placed is not None:
            self.records.append((value, list(headers)))
        return placed


class FakeProducer:
    """Stands in for aiokafka's producer (named fake: unit tests only). Its broker refuses any
    record batch over ``broker_limit`` bytes for good, and every send while ``down``."""

    def __init__(self, broker_limit: int = 1 << 30) -> None:
        self.broker_limit = broker_limit
        self.accepted: list[tuple[bytes, list[tuple[str, bytes]]]] = []  # records the broker took
        self.down = False
        self.logs: dict[int, int] = {0: 0, 1: 0}  # records acknowledged per partition
        self.results: list[dict[str, Any]] = []
        self.controls: list[tuple[str, bool]] = []  # (batch id, cancelled) of control messages

    def create_batch(self) -> HeaderRecordingBuilder:
        return HeaderRecordingBuilder()

    async def partitions_for(self, topic: str) -> set[int]:
        return set(self.logs)

    async def send_batch(self, builder: BatchBuilder, topic: str, *, partition: int) -> asyncio.Future[Any]:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if self.down:
            future.set_exception(KafkaConnectionError("broker unreachable"))
        elif builder.size() > self.broker_limit:
            future.set_exception(MessageSizeTooLargeError())
        else:
            future.set_result(Acked(self.logs[partition]))
            self.logs[partition] += builder.record_count()
            self.accepted.extend(getattr(builder, "records", []))
        return future

    async def send_and_wait(self, topic: str, value: bytes, key: bytes | None = None) -> Acked:
        message = decode(value)
        self.controls.append((message["batch_id"], bool(message.get("cancelled"))))
        return Acked(len(self.controls) - 1)

    async def send(self, topic: str, value: bytes, key: bytes | None = None) -> asyncio.Future[Any]:
        self.results.append(decode(value))
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        future.set_result(Acked(len(self.results) - 1))
        return future


SIGNER = RequestSigner("a-signing-key-for-these-tests")


def message(size: int) -> bytes:
    return b"m" * size


async def test_a_message_over_the_producer_limit_is_refused_and_the_others_are_sent() -> None:
    producer = FakeProducer()
    outgoing = RequestRound(producer, "requests.m", [0, 1], SIGNER, max_bytes=1000)  # type: ignore[arg-type]
    outgoing.add(message(100), 0)
    outgoing.add(message(5000), 0)
    outgoing.add(message(100), 1)
    placed = await outgoing.send()
    assert placed[0] == (0, 0) and placed[2] == (1, 0)
    assert isinstance(placed[1], Refused)
    assert "largest message sent is 1000 bytes" in placed[1].reason
    assert producer.logs == {0: 1, 1: 1}


async def test_a_batch_the_broker_refuses_is_sent_alone_so_only_its_bad_message_fails() -> None:
    producer = FakeProducer(broker_limit=2000)
    outgoing = RequestRound(producer, "requests.m", [0, 1], SIGNER, max_bytes=1 << 20)  # type: ignore[arg-type]
    for size in (100, 1500, 3000, 200):
        outgoing.add(message(size), 0)
    outgoing.add(message(300), 1)
    placed = await outgoing.send()
    assert isinstance(placed[2], Refused) and "MessageSizeTooLargeError" in placed[2].reason
    good = [placed[i] for i in (0, 1, 3, 4)]
    assert good == [(0, 0), (0, 1), (0, 2), (1, 0)]
    assert producer.logs == {0: 3, 1: 1}
    # Sent alone, each message still carries the api's signature, or no worker would run it.
    assert len(producer.accepted) == 4
    assert all(SIGNER.verified("requests.m", value, headers) for value, headers in producer.accepted)


async def test_an_unreachable_broker_still_fails_the_send_to_be_tried_again() -> None:
    producer = FakeProducer()
    producer.down = True
    outgoing = RequestRound(producer, "requests.m", [0], SIGNER, max_bytes=1 << 20)  # type: ignore[arg-type]
    outgoing.add(message(100), 0)
    with pytest.raises(KafkaConnectionError):
        await outgoing.send()


def batch() -> QueuedState:
    return QueuedState(
        batch_id="batch_1",
        model="m",
        project="p",
        status="in_progress",
        total=3,
        priority=0,
        expires_at=float("inf"),
        order=0,
        object_key="k",
        defaults=SamplingDefaults(),
        position=Position(),
    )


def raw_line(custom_id: str, content: str = "hi") -> bytes:
    body = {"model": "m", "messages": [{"role": "user", "content": content}]}
    return json.dumps(
        {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}
    ).encode()


async def test_refused_lines_become_their_own_line_undeliverable_results() -> None:
    producer = FakeProducer()
    sender = LineSender(producer, KafkaSettings(max_request_bytes=4096))  # type: ignore[arg-type]
    lines = [InputLine(1, 0, raw_line("small")), InputLine(2, 60, raw_line("big", "x" * 8000))]
    outgoing = await sender.round("requests.m")
    for line in lines:
        outgoing.add(sender.request(batch(), line), 0)
    placed = await outgoing.send()
    assert placed[0] == (0, 0)
    refused = placed[1]
    assert isinstance(refused, Refused)
    await sender.undeliverable("batch_1", [(lines[1], refused)])
    [result] = producer.results
    assert (result["batch_id"], result["line"], result["custom_id"]) == ("batch_1", 2, "big")
    assert result["error"]["code"] == UNDELIVERABLE_CODE
    assert "largest message sent is 4096 bytes" in result["error"]["message"]


def test_a_line_no_message_can_be_made_of_is_refused_not_raised() -> None:
    refused = LineSender.request(batch(), InputLine(1, 0, b"not json"))
    assert isinstance(refused, Refused) and "no request message" in refused.reason
