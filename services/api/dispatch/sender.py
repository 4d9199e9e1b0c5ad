"""The messages the dispatcher publishes: a line's ``RequestMessage``, a lost line's error result."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import orjson
from aiokafka import AIOKafkaProducer

from services.api.dispatch.journey import LOST_CODE, SentLine
from services.api.dispatch.reader import InputLine
from services.api.dispatch.state import QueuedState
from shared import ids
from shared.errors import echo
from shared.kafka import encode
from shared.protocol.batch_input import UTF8_BOM, parse_raw_line
from shared.protocol.messages import LineError, ResultMessage, request_message_json
from shared.request_signing import RequestSigner
from shared.settings import KafkaSettings
from shared.stores.models import MODEL_NOT_FOUND
from shared.topics import results_topic

LOST_MESSAGE = "This request was sent {n} times and no result ever reached the batch."
NO_MODEL = "The model {model} does not exist (no worker serves it)."


class RequestRound:
    """Request messages for one topic, gathered per partition into aiokafka record batches and
    sent with ``send_batch``. aiokafka's ``send`` costs, per message, a metadata wait, a
    partitioner call, a future and its resolution: a fifth of the api's CPU while it dispatched
    at full speed. A message with no partition goes to a random one, as aiokafka's default
    partitioner puts a message without a key. Each message carries the api's signature
    (``shared.request_signing``), without which a worker does not run it for its batch."""

    def __init__(
        self, producer: AIOKafkaProducer, topic: str, partitions: list[int], signer: RequestSigner
    ) -> None:
        self._producer = producer
        self._topic = topic
        self._signer = signer
        self._partitions = partitions
        self._builders: dict[int, list[Any]] = {}
        self._placed: list[tuple[int, int, int]] = []  # (partition, its builder, offset in it)

    def add(self, message: bytes, partition: int | None = None) -> None:
        if partition is None:
            partition = random.choice(self._partitions)
        builders = self._builders.setdefault(partition, [])
        headers = self._signer.headers(self._topic, message)
        placed = (
            builders[-1].append(timestamp=None, key=None, value=message, headers=headers)
            if builders
            else None
        )
        if placed is None:  # the first, or the last is full (a new batch takes any one message)
            builders.append(self._producer.create_batch())
            placed = builders[-1].append(timestamp=None, key=None, value=message, headers=headers)
        self._placed.append((partition, len(builders) - 1, placed.offset))

    async def send(self) -> list[tuple[int, int]]:
        """Send every batch; once the broker has them all, each message's (partition, offset),
        in the order they were added."""
        pending: dict[tuple[int, int], asyncio.Future[Any]] = {}
        for partition, builders in self._builders.items():
            for index, builder in enumerate(builders):
                builder.close()
                pending[partition, index] = await self._producer.send_batch(
                    builder, self._topic, partition=partition
                )
        bases = dict(zip(pending, await asyncio.gather(*pending.values()), strict=True))
        return [
            (partition, bases[partition, index].offset + relative)
            for partition, index, relative in self._placed
        ]


class LineSender:
    def __init__(self, producer: AIOKafkaProducer, kafka: KafkaSettings) -> None:
        self.producer = producer
        self.results_topic = results_topic(kafka)
        self.signer = RequestSigner(kafka.signing_key)

    async def round(self, topic: str) -> RequestRound:
        """An empty round of request messages for ``topic``."""
        partitions = sorted(await self.producer.partitions_for(topic))
        return RequestRound(self.producer, topic, partitions, self.signer)

    @staticmethod
    def request(batch: QueuedState, line: InputLine) -> bytes:
        """The line's request message."""
        item = parse_raw_line(line.raw)
        return request_message_json(
            request_id=ids.batch_request_id(),
            custom_id=item.custom_id,
            url=item.url,
            body=bytes(item.body),
            batch_id=batch.batch_id,
            line=line.number,
            project=batch.project,
            defaults=batch.defaults_json,
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

    async def lost(self, batch_id: str, lines: list[SentLine], raws: list[bytes]) -> None:
        """Publish each line's ``line_lost`` error result."""
        errors = []
        for line, raw in zip(lines, raws, strict=True):
            try:
                custom_id = str(orjson.loads(raw.removeprefix(UTF8_BOM)).get("custom_id"))
            except (orjson.JSONDecodeError, AttributeError):
                custom_id = ""
            error = LineError(code=LOST_CODE, message=LOST_MESSAGE.format(n=line.attempt))
            errors.append((line.line, custom_id, error))
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
