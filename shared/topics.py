"""Topic and consumer-group names, derived once from settings so every service agrees."""

from __future__ import annotations

import re
from typing import Literal, NamedTuple

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


_COMMIT_PROGRESS = re.compile(r"done-past-commit=(\d+);read-to=(\d+)")


class CommitProgress(NamedTuple):
    """What an inference worker commits as a requests partition offset's metadata: how many of
    the partition's lines past that offset it has finished (``done_past``), and the offset after
    the last line it read (``read_to``). A worker commits a partition only up to its oldest line
    still in flight, and it runs lines out of offset order (a project's fair share, a young batch
    first), so lines done past the commit are common; the dispatcher reads this with the offsets
    and does not meter them as queued. ``read_to`` bounds them: lines a pipeline wrote after the
    dispatcher's last send are among them. Standard Kafka (OffsetCommit metadata); a broker that
    does not keep it answers "", read as none."""

    done_past: int
    read_to: int

    def encode(self) -> str:
        return f"done-past-commit={self.done_past};read-to={self.read_to}"

    @classmethod
    def read(cls, metadata: str | None) -> CommitProgress | None:
        """What ``encode`` wrote, or None (no metadata, another writer's, malformed)."""
        match = _COMMIT_PROGRESS.fullmatch(metadata or "")
        return cls(int(match[1]), int(match[2])) if match else None


def dead_letters_topic(settings: KafkaSettings) -> str:
    """Where a worker puts a request message it does not run or cannot answer, with the reason
    (``shared.protocol.messages.DeadLetter``)."""
    return f"{settings.topic_prefix}dead-letters"


# Kafka's own rule for a topic name (and its longest).
_LEGAL_TOPIC = re.compile(r"[a-zA-Z0-9._-]{1,249}")
_INTERNAL_STEMS = ("requests.", "batchstream-")
"""Names under the topic prefix that start with these belong to the services: the requests
topics, and the consumer groups' and the aggregator's (faust's) own topics (the default app id)."""

ReplyTopicProblem = Literal["reply_topic_missing", "reply_topic_invalid", "reply_topic_internal"]


class ReplyTopicRule:
    """Which topics a request message may name as its ``reply_topic``: a legal Kafka topic name,
    matching ``KafkaSettings.reply_topic_pattern``, and none the services own (requests, results,
    control, dead letters, the aggregator's internal topics, Kafka's ``__`` topics). A worker
    publishes a pipeline's result to the topic the pipeline names, so without this rule a
    pipeline could write into the results topic (counted for any batch) or name a topic the
    producer waits on until its timeout."""

    def __init__(self, settings: KafkaSettings, aggregator_app_id: str) -> None:
        prefix = settings.topic_prefix
        self._pattern = re.compile(settings.reply_topic_pattern)
        owned = {results_topic(settings), control_topic(settings), dead_letters_topic(settings)}
        stems = {prefix + stem for stem in _INTERNAL_STEMS} | {f"{prefix}{aggregator_app_id}-", "__"}
        # Kafka treats '.' and '_' alike when it checks a new topic against existing ones.
        self._owned = {_collision_form(name) for name in owned}
        self._stems = tuple(_collision_form(stem) for stem in stems)

    def problem(self, topic: str | None) -> tuple[ReplyTopicProblem, str] | None:
        """None when ``topic`` may be answered to; else the reason and what is wrong."""
        if topic is None:
            return "reply_topic_missing", "a request of no batch must name its reply_topic"
        if _LEGAL_TOPIC.fullmatch(topic) is None or topic in {".", ".."}:
            return "reply_topic_invalid", "reply_topic is not a legal Kafka topic name"
        if self._pattern.search(topic) is None:
            return "reply_topic_invalid", "reply_topic does not match the deployment's reply_topic_pattern"
        form = _collision_form(topic)
        if form in self._owned or form.startswith(self._stems):
            return "reply_topic_internal", "reply_topic names a topic of the services"
        return None


def _collision_form(name: str) -> str:
    return name.replace(".", "_")
