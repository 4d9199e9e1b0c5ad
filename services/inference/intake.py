"""What a worker does with a request message before it spends engine time on it.

The requests topic is a public door: the api's dispatcher writes batch lines there, and pipelines
write their own requests. So a worker trusts a message only as far as it can check it
(docs/kafka-protocol.md#what-a-worker-runs):

- a message naming a ``batch_id`` runs for that batch only with the api's signature
  (``shared.request_signing``); without it, it is answered ``batch_not_verified`` on its reply
  topic, its batch fields dropped, and never reaches the results topic;
- any other message runs only when its ``reply_topic`` passes ``ReplyTopicRule`` (a legal name,
  the deployment's pattern, no topic of the services) and exists (``ReplyTopicProbe``);
- a message it can neither run nor answer goes to the dead-letter topic with the reason, and its
  offset commits like any other: nothing a publisher writes can stop or stall a worker.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec
from aiokafka import ConsumerRecord
from aiokafka.errors import KafkaError, LeaderNotAvailableError, for_code

from services.inference import metrics
from services.inference.handler import never_ran
from services.inference.publisher import UNDELIVERABLE
from shared.errors import ECHO_CHARS
from shared.kafka import decode, make_admin
from shared.protocol.messages import (
    BATCH_NOT_VERIFIED_CODE,
    BATCH_NOT_VERIFIED_MESSAGE,
    DEAD_LETTER_VALUE_BYTES,
    DeadLetter,
    DeadLetterReason,
    LineError,
    RequestMessage,
    ResultMessage,
    error_detail,
    read_request,
)
from shared.request_signing import RequestSigner
from shared.settings import AggregatorSettings, KafkaSettings
from shared.topics import ReplyTopicRule

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Run:
    """Run ``message`` on the engine; its result goes to ``reply_topic`` (None: the results
    topic, a verified batch line)."""

    message: RequestMessage
    reply_topic: str | None


@dataclass(frozen=True)
class Publish:
    """Publish ``result`` without running anything (an invalid or unverified message)."""

    result: ResultMessage
    reply_topic: str | None


@dataclass(frozen=True)
class Refusal:
    """Neither run nor answer it: a dead letter."""

    reason: DeadLetterReason
    detail: str
    request_id: Any = None
    reply_topic: Any = None

    def letter(self, record: ConsumerRecord[Any, Any]) -> DeadLetter:
        value: bytes = record.value or b""
        return DeadLetter(
            reason=self.reason,
            detail=self.detail,
            topic=record.topic,
            partition=record.partition,
            offset=record.offset,
            request_id=echo(self.request_id),
            reply_topic=echo(self.reply_topic),
            value=value[:DEAD_LETTER_VALUE_BYTES].decode("utf-8", "replace"),
            value_bytes=len(value),
        )


Verdict = Run | Publish | Refusal


class RequestIntake:
    """Judges each request message: run it, answer it without running, or refuse it."""

    def __init__(self, signer: RequestSigner, rule: ReplyTopicRule) -> None:
        self.signer = signer
        self.rule = rule

    @classmethod
    def from_settings(cls, kafka: KafkaSettings, aggregator: AggregatorSettings) -> RequestIntake:
        return cls(RequestSigner(kafka.signing_key), ReplyTopicRule(kafka, aggregator.app_id))

    def judge(self, record: ConsumerRecord[Any, Any]) -> Verdict:
        value: bytes = record.value or b""
        message = read_request(value)
        if message is None:  # not as the api writes it: coerced, or its error worded
            try:
                raw = decode(value)
            except ValueError as exc:
                metrics.SKIPPED.inc()
                return Refusal("invalid_message", str(exc))
            try:
                message = RequestMessage.from_value(raw)
            except msgspec.ValidationError as exc:
                return self._invalid(record, raw, exc)
        if message.batch_id is not None:
            if self._verified(record):
                return Run(message, message.reply_topic)
            return self._unverified(message)
        problem = self.rule.problem(message.reply_topic)
        if problem is not None:
            return Refusal(*problem, message.request_id, message.reply_topic)
        return Run(message, message.reply_topic)

    def _verified(self, record: ConsumerRecord[Any, Any]) -> bool:
        return self.signer.verified(record.topic, record.value or b"", record.headers)

    def _unverified(self, message: RequestMessage) -> Verdict:
        """A message naming a batch without the api's signature: refused on its reply topic, its
        batch fields dropped (a pipeline's mistake gets an answer; nothing reaches the batch)."""
        problem = self.rule.problem(message.reply_topic)
        if problem is not None:
            refusal = Refusal(*problem, message.request_id, message.reply_topic)
            if refusal.reason == "reply_topic_missing":  # the batch is what is wrong
                refusal = Refusal(
                    "batch_not_verified",
                    "names a batch_id without the api's signature",
                    message.request_id,
                    message.reply_topic,
                )
            return refusal
        stub = RequestMessage(request_id=message.request_id, custom_id=message.custom_id, url="", body={})
        error = LineError(code=BATCH_NOT_VERIFIED_CODE, message=BATCH_NOT_VERIFIED_MESSAGE)
        return Publish(never_ran(stub, error), message.reply_topic)

    def _invalid(
        self, record: ConsumerRecord[Any, Any], raw: dict[str, Any], exc: msgspec.ValidationError
    ) -> Verdict:
        """An error result for a message that names its line well enough and where it may be
        answered (its reply topic, or the results topic for a verified batch line); else a
        dead letter."""
        metrics.SKIPPED.inc()
        request_id, custom_id, reply = raw.get("request_id"), raw.get("custom_id"), raw.get("reply_topic")
        where = f"{record.topic}[{record.partition}]@{record.offset}"
        detail = error_detail(exc)
        log.warning("invalid request message: %s", detail, extra={"at": where})
        if not (isinstance(request_id, str) and isinstance(custom_id, str)):
            return Refusal("invalid_message", detail, request_id, reply)
        batch_id = raw.get("batch_id")
        verified = isinstance(batch_id, str) and self._verified(record)
        reply_topic = reply if isinstance(reply, str) and reply else None
        if not verified and self.rule.problem(reply_topic) is not None:
            return Refusal("invalid_message", detail, request_id, reply)
        line = raw.get("line")
        stub = RequestMessage(
            request_id=request_id,
            custom_id=custom_id,
            url="",
            body={},
            batch_id=batch_id if verified else None,
            line=line if verified and isinstance(line, int) else None,
        )
        error = LineError(code="invalid_request", message=f"Invalid request message: {detail}")
        return Publish(never_ran(stub, error), reply_topic)


def echo(value: Any) -> str | None:
    """A publisher's string as a dead letter or a log repeats it: cut to ``ECHO_CHARS``."""
    return value[:ECHO_CHARS] if isinstance(value, str) else None


# How long a probe's answer holds: a topic found stays usable a while (one metadata request per
# reply topic per minute at most), one not found may be created any moment.
FOUND_FOR_S = 60.0
MISSING_FOR_S = 5.0
PROBED_TOPICS = 4096
"""Most reply topics whose answer is remembered (the oldest are forgotten first)."""


class TopicDescriber(Protocol):
    """What the probe asks of aiokafka's admin client."""

    async def describe_topics(self, topics: list[str] | None = None) -> list[Any]: ...

    async def close(self) -> None: ...


class ReplyTopicProbe:
    """Whether a reply topic can take messages, asked of the broker once (one metadata request,
    shared by every request naming it at once) and remembered a while.

    aiokafka's producer waits its whole request timeout (~40 s here) for a topic the broker does
    not know before it fails, and a broker with topic creation off (the compose stack's) knows no
    topic a pipeline forgot to create: asked first, the worker dead-letters such a request at
    once, before it runs. A broker that cannot be asked is no answer: the send decides.
    """

    def __init__(
        self,
        kafka: KafkaSettings,
        clock: Callable[[], float] = time.monotonic,
        admin: TopicDescriber | None = None,
    ) -> None:
        self.kafka = kafka
        self.clock = clock
        self._admin = admin  # started at first use when not given
        self._answers: dict[str, tuple[float, str | None]] = {}
        self._asking: dict[str, asyncio.Future[str | None]] = {}

    async def problem(self, topic: str) -> str | None:
        """None when ``topic`` may take a reply (or the broker could not be asked); else the
        broker's refusal (e.g. ``UnknownTopicOrPartitionError``)."""
        known = self._answers.get(topic)
        if known is not None and self.clock() < known[0]:
            return known[1]
        asking = self._asking.get(topic)
        if asking is None:
            asking = self._asking[topic] = asyncio.ensure_future(self._ask(topic))
            asking.add_done_callback(lambda _: self._asking.pop(topic, None))
        return await asyncio.shield(asking)

    async def _ask(self, topic: str) -> str | None:
        try:
            if self._admin is None:
                client = make_admin(self.kafka)
                await client.start()
                self._admin = client
            described = await self._admin.describe_topics([topic])
        except KafkaError as exc:
            log.warning("could not ask the broker about a reply topic: %r", exc)
            return None
        codes = [entry.get("error_code", 0) for entry in described if entry.get("topic") == topic]
        error = for_code(codes[0]) if codes and codes[0] else None
        problem = error.__name__ if error is not None and issubclass(error, UNDELIVERABLE) else None
        if error is LeaderNotAvailableError:  # being created: it can take messages soon
            problem = None
        if len(self._answers) >= PROBED_TOPICS:
            del self._answers[next(iter(self._answers))]
        self._answers[topic] = (self.clock() + (MISSING_FOR_S if problem else FOUND_FOR_S), problem)
        return problem

    async def close(self) -> None:
        if self._admin is not None:
            await self._admin.close()
            self._admin = None
