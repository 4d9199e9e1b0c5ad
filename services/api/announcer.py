"""Announcing batch facts on the control topic (the lines go out through services/api/dispatch)."""

from __future__ import annotations

import logging

from aiokafka import AIOKafkaProducer

from shared.kafka import encode
from shared.protocol.messages import ControlMessage
from shared.settings import KafkaSettings
from shared.topics import control_topic

log = logging.getLogger(__name__)


class ControlAnnouncer:
    def __init__(self, producer: AIOKafkaProducer, settings: KafkaSettings) -> None:
        self.producer = producer
        self.settings = settings

    async def announce(self, message: ControlMessage) -> None:
        """Publish batch facts (total, deadline, cancellation) to the compacted control topic."""
        await self.producer.send_and_wait(
            control_topic(self.settings), encode(message), key=message.batch_id.encode()
        )
