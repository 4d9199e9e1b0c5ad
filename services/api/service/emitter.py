"""Publishing a validated batch's lines to its model's requests topic."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from aiokafka import AIOKafkaProducer

from shared import ids
from shared.documents import BatchDocument
from shared.kafka import encode, ensure_topics
from shared.protocol.batch_input import BatchRequestInput
from shared.protocol.messages import ControlMessage, RequestMessage
from shared.settings import KafkaSettings
from shared.topics import control_topic, requests_topic

log = logging.getLogger(__name__)

# Sends awaited together; bounds the memory held by pending futures.
SEND_WINDOW = 2000


class RequestEmitter:
    def __init__(self, producer: AIOKafkaProducer, settings: KafkaSettings) -> None:
        self.producer = producer
        self.settings = settings
        self._ensured: set[str] = set()  # models whose requests topic exists already

    async def emit(self, batch: BatchDocument, lines: AsyncIterator[bytes]) -> int:
        """Publish one RequestMessage per non-blank line; returns the number published."""
        model = str(batch.model)
        topic = requests_topic(self.settings, model)
        if model not in self._ensured:
            await ensure_topics(self.settings, [model])
            self._ensured.add(model)
        defaults = batch.defaults
        pending: list[asyncio.Future[Any]] = []
        number = sent = 0
        async for raw in lines:
            number += 1
            if not raw.strip():
                continue
            item = BatchRequestInput.model_validate(json.loads(raw))
            message = RequestMessage(
                request_id=ids.batch_request_id(),
                custom_id=item.custom_id,
                url=item.url,
                body=item.body,
                batch_id=batch.id,
                line=number,
                defaults=defaults,
                expires_at=batch.expires_at,
            )
            pending.append(await self.producer.send(topic, encode(message)))
            sent += 1
            if len(pending) >= SEND_WINDOW:
                await asyncio.gather(*pending)
                pending.clear()
        await asyncio.gather(*pending)
        log.info("emitted requests", extra={"batch_id": batch.id, "topic": topic, "lines": sent})
        return sent

    async def announce(self, message: ControlMessage) -> None:
        """Publish batch facts (total, deadline, cancellation) to the compacted control topic."""
        await self.producer.send_and_wait(
            control_topic(self.settings), encode(message), key=message.batch_id.encode()
        )
