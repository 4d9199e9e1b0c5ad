"""Topic names, derived once from settings so every service agrees."""

from __future__ import annotations

import re

from shared.settings import KafkaSettings

_INVALID = re.compile(r"[^a-zA-Z0-9._-]")


def model_slug(model: str) -> str:
    """A model id made safe for a topic name (Kafka allows ``[a-zA-Z0-9._-]``)."""
    return _INVALID.sub("_", model)[:200]


def requests_topic(settings: KafkaSettings, model: str) -> str:
    return f"{settings.topic_prefix}requests.{model_slug(model)}"


def results_topic(settings: KafkaSettings) -> str:
    return f"{settings.topic_prefix}results"


def control_topic(settings: KafkaSettings) -> str:
    return f"{settings.topic_prefix}control"
