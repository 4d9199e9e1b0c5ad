"""What a worker does with a request message before the engine: the api's signed batch lines run
for their batch; anything else runs only for a reply topic of its own, is refused there, or is
dead-lettered."""

from __future__ import annotations

import json
from typing import Any

from aiokafka import ConsumerRecord

from services.inference.intake import Publish, Refusal, RequestIntake, Run
from shared.kafka import encode
from shared.protocol.messages import BATCH_NOT_VERIFIED_CODE, DEAD_LETTER_VALUE_BYTES, RequestMessage
from shared.request_signing import RequestSigner
from shared.settings import AggregatorSettings, KafkaSettings

SETTINGS = KafkaSettings(topic_prefix="t.")
TOPIC = "t.requests.m"
INTAKE = RequestIntake.from_settings(SETTINGS, AggregatorSettings())
API = RequestSigner(SETTINGS.signing_key)


def record(value: bytes, *, signed: bool = False, topic: str = TOPIC) -> ConsumerRecord[Any, Any]:
    headers = tuple(API.headers(topic, value)) if signed else ()
    return ConsumerRecord(topic, 0, 7, 0, 0, None, value, None, 0, len(value), headers)


def message(**fields: Any) -> bytes:
    base: dict[str, Any] = {"request_id": "r1", "custom_id": "c1", "url": "/v1/chat/completions"}
    return encode(RequestMessage(**base, body={"messages": []}, **fields))


def test_the_apis_signed_batch_line_runs_for_its_batch() -> None:
    verdict = INTAKE.judge(record(message(batch_id="batch_a", line=3), signed=True))
    assert isinstance(verdict, Run) and verdict.reply_topic is None  # to the results topic
    assert (verdict.message.batch_id, verdict.message.line) == ("batch_a", 3)


def test_a_signature_for_another_topic_does_not_count() -> None:
    value = message(batch_id="batch_a", line=3)
    headers = tuple(API.headers("t.requests.other", value))
    verdict = INTAKE.judge(ConsumerRecord(TOPIC, 0, 7, 0, 0, None, value, None, 0, len(value), headers))
    assert isinstance(verdict, Refusal) and verdict.reason == "batch_not_verified"


def test_an_unsigned_batch_line_without_a_reply_topic_is_dead_lettered() -> None:
    verdict = INTAKE.judge(record(message(batch_id="batch_a", line=3)))
    assert isinstance(verdict, Refusal) and verdict.reason == "batch_not_verified"
    letter = verdict.letter(record(message(batch_id="batch_a", line=3)))
    assert (letter.topic, letter.partition, letter.offset, letter.request_id) == (TOPIC, 0, 7, "r1")
    assert json.loads(letter.value)["batch_id"] == "batch_a"


def test_an_unsigned_batch_line_with_a_reply_topic_is_refused_there_without_its_batch() -> None:
    verdict = INTAKE.judge(record(message(batch_id="batch_a", line=3, reply_topic="t.replies")))
    assert isinstance(verdict, Publish) and verdict.reply_topic == "t.replies"
    result = verdict.result
    assert result.batch_id is None and result.line is None and result.response is None
    assert result.error is not None and result.error.code == BATCH_NOT_VERIFIED_CODE
    assert (result.request_id, result.custom_id) == ("r1", "c1")


def test_an_unsigned_batch_line_naming_the_results_topic_is_dead_lettered() -> None:
    verdict = INTAKE.judge(record(message(batch_id="batch_a", line=3, reply_topic="t.results")))
    assert isinstance(verdict, Refusal) and verdict.reason == "reply_topic_internal"


def test_a_pipeline_request_runs_for_its_own_reply_topic_only() -> None:
    verdict = INTAKE.judge(record(message(reply_topic="t.replies")))
    assert isinstance(verdict, Run) and verdict.reply_topic == "t.replies"
    for reply, reason in [
        (None, "reply_topic_missing"),
        ("bad topic name!", "reply_topic_invalid"),
        ("t.requests.m", "reply_topic_internal"),
        ("t.control", "reply_topic_internal"),
    ]:
        verdict = INTAKE.judge(record(message(reply_topic=reply)))
        assert isinstance(verdict, Refusal) and verdict.reason == reason, reply


def test_an_invalid_message_is_answered_only_where_it_may_be() -> None:
    bad = {"request_id": "r1", "custom_id": "c1", "reply_topic": "t.replies"}
    verdict = INTAKE.judge(record(json.dumps(bad).encode()))
    assert isinstance(verdict, Publish) and verdict.reply_topic == "t.replies"
    assert verdict.result.error is not None and verdict.result.error.code == "invalid_request"
    # Naming a batch without the signature reaches neither the batch nor the results topic.
    forged = {"request_id": "r1", "custom_id": "c1", "batch_id": "batch_a", "line": 1}
    verdict = INTAKE.judge(record(json.dumps(forged).encode()))
    assert isinstance(verdict, Refusal) and verdict.reason == "invalid_message"
    verdict = INTAKE.judge(record(json.dumps({**forged, "reply_topic": "t.replies"}).encode()))
    assert isinstance(verdict, Publish) and verdict.result.batch_id is None and verdict.result.line is None
    verdict = INTAKE.judge(record(b"not json"))
    assert isinstance(verdict, Refusal) and verdict.reason == "invalid_message"


def test_a_dead_letter_holds_the_message_cut_short() -> None:
    value = json.dumps(
        {"request_id": "r" * 500, "reply_topic": "bad topic " * 50, "pad": "é" * 5000}
    ).encode()
    verdict = INTAKE.judge(record(value))
    assert isinstance(verdict, Refusal) and verdict.reason == "invalid_message"
    letter = verdict.letter(record(value))
    assert letter.value_bytes == len(value) and len(letter.value.encode()) <= DEAD_LETTER_VALUE_BYTES + 3
    assert (
        letter.request_id == "r" * 200 and letter.reply_topic is not None and len(letter.reply_topic) == 200
    )


def test_a_batch_lines_project_is_signed_with_it() -> None:
    """The dispatcher's message names the batch's project, which the signature covers: a
    message whose project was changed is not run for its batch."""
    value = message(batch_id="batch_a", line=3, project="proj-a")
    verdict = INTAKE.judge(record(value, signed=True))
    assert isinstance(verdict, Run) and verdict.message.project == "proj-a"
    headers = tuple(API.headers(TOPIC, value))
    forged = value.replace(b'"proj-a"', b'"proj-b"')
    verdict = INTAKE.judge(ConsumerRecord(TOPIC, 0, 7, 0, 0, None, forged, None, 0, len(forged), headers))
    assert isinstance(verdict, Refusal) and verdict.reason == "batch_not_verified"
