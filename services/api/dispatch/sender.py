"""The messages the dispatcher publishes: a line's ``RequestMessage``, a lost line's error result."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from aiokafka import AIOKafkaProducer

from services.api.dispatch.journey import LOST_CODE, SentLine
from services.api.dispatch.reader import InputLine
from services.api.dispatch.state import QueuedState
from shared import ids
from shared.kafka import encode
from shared.protocol.batch_input import UTF8_BOM, parse_raw_line
from shared.protocol.messages import LineError, ResultMessage, request_message_json
from shared.settings import KafkaSettings
from shared.stores.models import MODEL_NOT_FOUND
from shared.topics import results_topic

LOST_MESSAGE = "This request was sent {n} times and no result ever reached the batch."
NO_MODEL = "The model {model!r} does not exist (no worker serves it)."


class LineSender:
    def __init__(self, producer: AIOKafkaProducer, kafka: KafkaSettings) -> None:
        self.producer = producer
        self.results_topic = results_topic(kafka)

    async def request(
        self, topic: str, batch: QueuedState, line: InputLine, partition: int | None = None
    ) -> asyncio.Future[Any]:
        """Hand the line's request to the producer (to ``partition``, or where the producer
        puts it); await the future for its acknowledgement."""
        item = parse_raw_line(line.raw)
        message = request_message_json(
            request_id=ids.batch_request_id(),
            custom_id=item.custom_id,
            url=item.url,
            body=bytes(item.body),
            batch_id=batch.batch_id,
            line=line.number,
            defaults=batch.defaults_json,
            expires_at=batch.expires_at,
        )
        return await self.producer.send(topic, message, partition=partition)

    async def refuse(self, batch_id: str, lines: list[InputLine]) -> None:
        """Publish each line's ``model_not_found`` error result (a mixed batch's line naming a
        model no worker serves)."""
        errors = []
        for line in lines:
            item = orjson.loads(line.raw.removeprefix(UTF8_BOM))
            body = item.get("body") if isinstance(item.get("body"), dict) else {}
            error = LineError(code=MODEL_NOT_FOUND, message=NO_MODEL.format(model=body.get("model")))
            errors.append((line.number, str(item.get("custom_id", "")), error))
        await self._publish_errors(batch_id, errors)

    async def lost(self, batch_id: str, lines: list[SentLine], raws: list[bytes]) -> None:
        """Publish each line's ``line_lost`` error result."""
        errors = []
        for line, raw in zip(lines, raws, strict=True):
            try:
                custom_id = str(orjson.loads(raw).get("custom_id"))
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
