"""Kafka settings of a test's own on a running broker: a fresh topic prefix, the topics created."""

from __future__ import annotations

import uuid

from shared.kafka import ensure_topics, wait_for_kafka
from shared.settings import KafkaSettings


async def fresh_kafka(bootstrap_servers: str, models: list[str], partitions: int = 2) -> KafkaSettings:
    """Settings under a new ``t<random>.`` prefix, with ``models``' requests, results and control
    topics created once the broker answers (``partitions`` each)."""
    settings = KafkaSettings(
        bootstrap_servers=bootstrap_servers,
        topic_prefix=f"t{uuid.uuid4().hex[:8]}.",
        request_partitions=partitions,
        results_partitions=partitions,
    )
    await wait_for_kafka(settings, timeout_s=10)
    await ensure_topics(settings, models)
    return settings
