"""Publish request lines straight to a model's requests topic and read their results from Kafka.

For pipelines that skip the HTTP api: no file upload, no batch. Each line (the input-file shape:
``custom_id``, ``method``, ``url``, ``body``) becomes a ``RequestMessage`` (docs/schemas/
request-message.json) that names the pipeline's own reply topic; an inference worker answers each
with one ``ResultMessage`` (docs/schemas/result-message.json) on that topic::

    async with KafkaRequestClient(model="gemma-3-270m", reply_topic="my-pipeline.replies") as kafka:
        for line in lines:
            await kafka.publish(line)
        async for result in kafka.results(timeout_s=600):
            print(result.output_line())  # the same JSON as a line of a batch's output file

Delivery is at least once, as everywhere in batchstream: a worker restarted mid-request may answer
it twice, so ``results`` yields each request id once and drops repeats. Results are read with a
consumer group (``group_id``, default ``<reply_topic>.reader``) whose offsets are committed after
the results were yielded: a reader that stops early and comes back resumes there. Results for
request ids this client did not publish (an earlier run's) are skipped; a reply topic per run
keeps runs apart. Kafka addresses come from ``KafkaSettings`` (``BATCHSTREAM_KAFKA_*``).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Mapping
from types import TracebackType
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka.admin import NewTopic
from aiokafka.errors import TopicAlreadyExistsError

from shared.ids import batch_request_id
from shared.kafka import connection, encode, make_admin, make_producer
from shared.protocol.messages import RequestMessage, ResultMessage, SamplingDefaults
from shared.settings import AggregatorSettings, KafkaSettings
from shared.topics import ReplyTopicRule, requests_topic


class KafkaRequestClient:
    """Publishes one model's request lines naming ``reply_topic`` and reads the answers to them."""

    def __init__(
        self,
        model: str,
        reply_topic: str,
        settings: KafkaSettings | None = None,
        group_id: str | None = None,
    ) -> None:
        self.settings = settings or KafkaSettings()
        problem = ReplyTopicRule(self.settings, AggregatorSettings().app_id).problem(reply_topic)
        if problem is not None:  # a worker would dead-letter every request: say so now
            raise ValueError(f"reply_topic {reply_topic!r}: {problem[1]}")
        self.model = model
        self.reply_topic = reply_topic
        self.group_id = group_id or f"{reply_topic}.reader"
        self.pending: set[str] = set()  # request ids published and not yet answered
        self._producer = make_producer(self.settings)
        self._consumer: AIOKafkaConsumer | None = None

    async def __aenter__(self) -> KafkaRequestClient:
        await self.ensure_reply_topic()
        await self._producer.start()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._producer.stop()
        if self._consumer is not None:
            await self._consumer.stop()

    async def ensure_reply_topic(self) -> None:
        """Create the reply topic unless it exists (a cluster may not create topics on first use)."""
        admin = make_admin(self.settings)
        await admin.start()
        try:
            if self.reply_topic not in set(await admin.list_topics()):
                topic = NewTopic(
                    self.reply_topic, self.settings.results_partitions, self.settings.replication_factor
                )
                await admin.create_topics([topic])
        except TopicAlreadyExistsError:
            pass
        finally:
            await admin.close()

    async def publish(
        self,
        line: Mapping[str, Any],
        *,
        defaults: SamplingDefaults | None = None,
        expires_at: float | None = None,
    ) -> RequestMessage:
        """Publish one input line (``custom_id``, ``url``, ``body``; ``method`` POST); returns the message.

        ``defaults`` are the batch-level defaults a request body may override; ``expires_at``
        (Unix seconds) makes a worker answer ``batch_expired`` instead of running a late line.
        """
        message = RequestMessage.from_value(
            {
                **line,
                "request_id": batch_request_id(),
                "reply_topic": self.reply_topic,
                "defaults": defaults.model_dump() if defaults is not None else None,
                "expires_at": expires_at,
            }
        )
        await self._producer.send_and_wait(requests_topic(self.settings, self.model), encode(message))
        self.pending.add(message.request_id)
        return message

    async def results(self, timeout_s: float | None = None) -> AsyncIterator[ResultMessage]:
        """Yield a result for each published request, in arrival order, until none is pending.

        Raises ``TimeoutError`` when ``timeout_s`` passes first (``pending`` names what is missing).
        """
        consumer = await self._reader()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while self.pending:
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"{len(self.pending)} requests unanswered after {timeout_s:g}s")
            fetched = await consumer.getmany(timeout_ms=200)
            for records in fetched.values():
                for record in records:
                    if record.value is None:
                        continue
                    result = ResultMessage.from_json(record.value)
                    if result.request_id in self.pending:
                        self.pending.discard(result.request_id)
                        yield result
            if fetched:
                await consumer.commit()

    async def _reader(self) -> AIOKafkaConsumer:
        if self._consumer is None:
            self._consumer = AIOKafkaConsumer(
                self.reply_topic,
                **connection(self.settings),
                group_id=self.group_id,
                auto_offset_reset="earliest",
                enable_auto_commit=False,
            )
            await self._consumer.start()
        return self._consumer


async def run_lines(
    model: str, reply_topic: str, lines: list[Mapping[str, Any]], timeout_s: float | None = None
) -> list[ResultMessage]:
    """Publish ``lines`` and return their results (arrival order): the whole flow in one call."""
    async with KafkaRequestClient(model, reply_topic) as kafka:
        for line in lines:
            await kafka.publish(line)
        return [result async for result in kafka.results(timeout_s)]
