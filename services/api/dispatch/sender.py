"""The messages the dispatcher publishes: a line's ``RequestMessage``; the error result of a line
lost on the way, of one naming no served model, and of one that cannot be sent at all.

A line is refused for good (``Refused``) when its request message is larger than the producer
sends (``BATCHSTREAM_KAFKA_MAX_REQUEST_BYTES``), when the broker refuses it alone with an error
that no retry mends (``LINE_REFUSALS``: larger than its ``message.max.bytes``, an invalid topic),
or when no message can be made of it: it becomes that line's ``line_undeliverable`` error result
and the round goes on. Any other failure (the broker unreachable, a timeout) fails the send as a
whole, and the round is tried again.
"""

from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import dataclass
from typing import Any

import orjson
from aiokafka import AIOKafkaProducer
from aiokafka.errors import (
    CorruptRecordException,
    InvalidTopicError,
    MessageSizeTooLargeError,
    RecordListTooLargeError,
    RecordTooLargeError,
)
from aiokafka.record.default_records import DefaultRecordBatchBuilder

from services.api.dispatch.reader import InputLine
from services.api.dispatch.sent_lines import LOST_CODE, SentLine
from services.api.dispatch.state import QueuedState
from shared import ids
from shared.errors import echo
from shared.kafka import encode
from shared.protocol.batch_input import UTF8_BOM, parse_raw_line
from shared.protocol.messages import LineError, RequestMessage, ResultMessage
from shared.protocol.result_message import UNDELIVERABLE_CODE
from shared.request_signing import RequestSigner
from shared.settings import KafkaSettings
from shared.stores.models import MODEL_NOT_FOUND
from shared.topics import results_topic

log = logging.getLogger(__name__)

LOST_MESSAGE = "This request was sent {n} times and no result ever reached the batch."
NO_MODEL = "The model {model} does not exist (no worker serves it)."
UNDELIVERABLE_MESSAGE = "This request could not be sent to the model's workers: {reason}."
OVER_LIMIT = "its message is {size} bytes, and the largest message sent is {limit} bytes"
BROKER_REFUSED = "the broker refused it ({error})"
NOT_A_MESSAGE = "no request message could be made of it ({error})"

LINE_REFUSALS: tuple[type[Exception], ...] = (
    MessageSizeTooLargeError,
    RecordListTooLargeError,
    RecordTooLargeError,
    InvalidTopicError,
    CorruptRecordException,
)
"""Errors of a send that no retry mends: sent alone, the message is its line's error result."""


@dataclass(frozen=True, slots=True)
class Refused:
    """A line's request message refused for good, and why (the end of its error message)."""

    reason: str


class RequestRound:
    """Request messages for one topic, gathered per partition into aiokafka record batches and
    sent with ``send_batch``. aiokafka's ``send`` costs, per message, a metadata wait, a
    partitioner call, a future and its resolution: a fifth of the api's CPU while it dispatched
    at full speed. A message with no partition goes to a random one, as aiokafka's default
    partitioner puts a message without a key. Each message carries the api's signature
    (``shared.request_signing``), without which a worker does not run it for its batch."""

    def __init__(
        self,
        producer: AIOKafkaProducer,
        topic: str,
        partitions: list[int],
        signer: RequestSigner,
        max_bytes: int,
    ) -> None:
        self._producer = producer
        self._topic = topic
        self._signer = signer
        self._partitions = partitions
        self._max_bytes = max_bytes
        self._builders: dict[int, list[Any]] = {}
        self._messages: dict[tuple[int, int], list[bytes]] = {}  # each builder's, to send alone
        # Per message added: (partition, its builder, offset in it), or why it was refused.
        self._placed: list[tuple[int, int, int] | Refused] = []

    def add(self, message: bytes | Refused, partition: int | None = None) -> None:
        if isinstance(message, Refused):
            self._placed.append(message)
            return
        headers = self._signer.headers(self._topic, message)
        size = DefaultRecordBatchBuilder.estimate_size_in_bytes(None, message, headers)
        if size > self._max_bytes:  # as the producer's ``send`` checks (``send_batch`` does not)
            self._placed.append(Refused(OVER_LIMIT.format(size=size, limit=self._max_bytes)))
            return
        if partition is None:
            partition = random.choice(self._partitions)
        builders = self._builders.setdefault(partition, [])
        placed = (
            builders[-1].append(timestamp=None, key=None, value=message, headers=headers)
            if builders
            else None
        )
        if placed is None:  # the first, or the last is full (a new batch takes any one message)
            builders.append(self._producer.create_batch())
            placed = builders[-1].append(timestamp=None, key=None, value=message, headers=headers)
        self._messages.setdefault((partition, len(builders) - 1), []).append(message)
        self._placed.append((partition, len(builders) - 1, placed.offset))

    async def send(self) -> list[tuple[int, int] | Refused]:
        """Send every batch; once the broker has them all, each message's (partition, offset),
        or why it was refused for good, in the order they were added. A batch the broker
        refuses for good is sent again one message at a time, so only its bad lines fail."""
        pending: dict[tuple[int, int], asyncio.Future[Any]] = {}
        for partition, builders in self._builders.items():
            for index, builder in enumerate(builders):
                builder.close()
                pending[partition, index] = await self._producer.send_batch(
                    builder, self._topic, partition=partition
                )
        answers = await asyncio.gather(*pending.values(), return_exceptions=True)
        # Per builder: the base offset of its messages, or each message's own place.
        bases: dict[tuple[int, int], int] = {}
        alone: dict[tuple[int, int], list[tuple[int, int] | Refused]] = {}
        for where, answer in zip(pending, answers, strict=True):
            if not isinstance(answer, BaseException):
                bases[where] = answer.offset
            elif isinstance(answer, LINE_REFUSALS):
                alone[where] = await self._send_alone(where[0], self._messages[where])
            else:
                raise answer
        placed: list[tuple[int, int] | Refused] = []
        for place in self._placed:
            if isinstance(place, Refused):
                placed.append(place)
            elif place[:2] in bases:
                placed.append((place[0], bases[place[:2]] + place[2]))
            else:  # its builder's messages went alone, in the order added (offsets 0, 1, ...)
                placed.append(alone[place[:2]][place[2]])
        return placed

    async def _send_alone(self, partition: int, messages: list[bytes]) -> list[tuple[int, int] | Refused]:
        """Each message in a batch of its own: its (partition, offset), or why it was refused."""
        futures = []
        for message in messages:
            builder = self._producer.create_batch()
            headers = self._signer.headers(self._topic, message)  # signed, as in its first batch
            builder.append(timestamp=None, key=None, value=message, headers=headers)
            builder.close()
            futures.append(await self._producer.send_batch(builder, self._topic, partition=partition))
        placed: list[tuple[int, int] | Refused] = []
        for answer in await asyncio.gather(*futures, return_exceptions=True):
            if isinstance(answer, LINE_REFUSALS):
                log.warning("the broker refused a request message", extra={"topic": self._topic})
                placed.append(Refused(BROKER_REFUSED.format(error=type(answer).__name__)))
            elif isinstance(answer, BaseException):
                raise answer
            else:
                placed.append((partition, answer.offset))
        return placed


class LineSender:
    def __init__(self, producer: AIOKafkaProducer, kafka: KafkaSettings) -> None:
        self.producer = producer
        self.results_topic = results_topic(kafka)
        self.signer = RequestSigner(kafka.signing_key)
        self.max_bytes = kafka.max_request_bytes  # the producer's ``max_request_size``

    async def round(self, topic: str) -> RequestRound:
        """An empty round of request messages for ``topic``."""
        partitions = sorted(await self.producer.partitions_for(topic))
        return RequestRound(self.producer, topic, partitions, self.signer, self.max_bytes)

    @staticmethod
    def request(batch: QueuedState, line: InputLine) -> bytes | Refused:
        """The line's request message (validated lines make one; any that does not is refused)."""
        try:
            return LineSender._request(batch, line)
        except Exception as exc:
            log.exception("no request message for a line", extra={"batch_id": batch.batch_id})
            return Refused(NOT_A_MESSAGE.format(error=type(exc).__name__))

    @staticmethod
    def _request(batch: QueuedState, line: InputLine) -> bytes:
        item = parse_raw_line(line.raw)
        return RequestMessage.batch_line(
            request_id=ids.batch_request_id(),
            custom_id=item.custom_id,
            url=item.url,
            body=bytes(item.body),
            batch_id=batch.batch_id,
            line=line.number,
            project=batch.project,
            defaults=batch.message_defaults,
            expires_at=batch.expires_at,
        )

    async def refuse(self, batch_id: str, lines: list[InputLine]) -> None:
        """Publish each line's ``model_not_found`` error result (a mixed batch's line naming a
        model no worker serves)."""
        errors = []
        for line in lines:
            item = orjson.loads(line.raw.removeprefix(UTF8_BOM))
            body = item.get("body") if isinstance(item.get("body"), dict) else {}
            error = LineError(code=MODEL_NOT_FOUND, message=NO_MODEL.format(model=echo(body.get("model"))))
            errors.append((line.number, str(item.get("custom_id", "")), error))
        await self._publish_errors(batch_id, errors)

    async def undeliverable(self, batch_id: str, lines: list[tuple[InputLine, Refused]]) -> None:
        """Publish each refused line's ``line_undeliverable`` error result."""
        errors = []
        for line, refused in lines:
            error = LineError(
                code=UNDELIVERABLE_CODE, message=UNDELIVERABLE_MESSAGE.format(reason=refused.reason)
            )
            errors.append((line.number, _custom_id(line.raw), error))
        await self._publish_errors(batch_id, errors)

    async def lost(self, batch_id: str, lines: list[SentLine], raws: list[bytes]) -> None:
        """Publish each line's ``line_lost`` error result."""
        errors = []
        for line, raw in zip(lines, raws, strict=True):
            error = LineError(code=LOST_CODE, message=LOST_MESSAGE.format(n=line.attempt))
            errors.append((line.line, _custom_id(raw), error))
        await self._publish_errors(batch_id, errors)

    async def _publish_errors(self, batch_id: str, errors: list[tuple[int, str, LineError]]) -> None:
        """One error result per ``(line, custom_id, error)``, awaited until the broker has them
        all: the aggregator counts each like any result."""
        futures = []
        for line, custom_id, error in errors:
            result = ResultMessage(
                request_id=ids.batch_request_id(),
                custom_id=custom_id,
                batch_id=batch_id,
                line=line,
                error=error,
            )
            futures.append(
                await self.producer.send(self.results_topic, encode(result), key=batch_id.encode())
            )
        await asyncio.gather(*futures)


def _custom_id(raw: bytes) -> str:
    """A line's custom_id, for its error result ("" when it has none to read)."""
    try:
        return str(orjson.loads(raw.removeprefix(UTF8_BOM)).get("custom_id"))
    except (orjson.JSONDecodeError, AttributeError):
        return ""
