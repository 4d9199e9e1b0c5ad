"""Which reply topics a request may name: legal, the deployment's pattern, none of the services'."""

from __future__ import annotations

import pydantic
import pytest

from shared.kafka_client import KafkaRequestClient
from shared.settings import KafkaSettings
from shared.topics import ReplyTopicRule

RULE = ReplyTopicRule(KafkaSettings(topic_prefix="prod."), "batchstream-aggregator")


@pytest.mark.parametrize(
    "topic",
    ["my-pipeline.results", "my-pipeline.replies", "prod.replies-1a2b", "replies.team_a", "x" * 249],
)
def test_a_pipelines_own_topic_may_be_answered(topic: str) -> None:
    assert RULE.problem(topic) is None


@pytest.mark.parametrize(
    ("topic", "reason"),
    [
        (None, "reply_topic_missing"),
        ("bad topic name!", "reply_topic_invalid"),
        ("", "reply_topic_invalid"),
        ("..", "reply_topic_invalid"),
        ("x" * 250, "reply_topic_invalid"),
        ("ümlaut", "reply_topic_invalid"),
        ("prod.results", "reply_topic_internal"),
        ("prod.control", "reply_topic_internal"),
        ("prod.dead-letters", "reply_topic_internal"),
        ("prod.requests.gemma-3-270m", "reply_topic_internal"),
        ("prod.batchstream-aggregator-batch-state-changelog", "reply_topic_internal"),
        ("prod.batchstream-inference-gemma", "reply_topic_internal"),
        ("__consumer_offsets", "reply_topic_internal"),
        ("prod_results", "reply_topic_internal"),  # Kafka holds '.' and '_' alike: it collides
        ("prod.requests_gemma", "reply_topic_internal"),
    ],
)
def test_a_missing_illegal_or_internal_topic_is_refused(topic: str | None, reason: str) -> None:
    problem = RULE.problem(topic)
    assert problem is not None and problem[0] == reason


def test_the_deployments_pattern_narrows_what_pipelines_may_name() -> None:
    settings = KafkaSettings(reply_topic_pattern=r"^replies\.[A-Za-z0-9._-]+$")
    rule = ReplyTopicRule(settings, "batchstream-aggregator")
    assert rule.problem("replies.team-a") is None
    problem = rule.problem("team-a.replies")
    assert problem is not None and problem[0] == "reply_topic_invalid"
    assert "reply_topic_pattern" in problem[1]


def test_a_pattern_that_is_not_a_regular_expression_is_refused() -> None:
    with pytest.raises(pydantic.ValidationError, match="reply_topic_pattern"):
        KafkaSettings(reply_topic_pattern="(")


def test_an_aggregator_with_another_app_id_keeps_its_topics() -> None:
    rule = ReplyTopicRule(KafkaSettings(), "agg-eu")
    problem = rule.problem("agg-eu-batch-state-changelog")
    assert problem is not None and problem[0] == "reply_topic_internal"


@pytest.mark.parametrize("topic", ["bad topic name!", "results", "requests.m"])
def test_the_python_helper_refuses_a_reply_topic_no_worker_would_answer(topic: str) -> None:
    with pytest.raises(ValueError, match="reply_topic"):
        KafkaRequestClient("m", topic, KafkaSettings())
