"""Topic and consumer-group names, derived once from settings so every service agrees."""

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


def inference_group(settings: KafkaSettings, model: str) -> str:
    """The consumer group of a model's inference workers. The workers join it and the api's
    dispatcher meters the requests topic by its committed offsets, so both take it from here."""
    return f"{settings.topic_prefix}batchstream-inference-{model_slug(model)}"
