"""Results to the broker: the results of one batch that finish together go out as one message.

One Kafka message per line cost the worker's producer and the aggregator's consumer more than
the line's own work. So a batch line's result joins its batch's open group (``result_group_json``,
version 2 of the results schema), and a group goes out when nothing of its batch is on its way to
the broker: the results finished in the same turn of the event loop, or while the previous group
waited for its acknowledgement, travel together. An idle worker adds no wait (a lone result goes
at once, as a version-1 message); a busy one sends fewer, larger messages, up to
``GROUP_MAX_RESULTS`` results or ``GROUP_MAX_BYTES`` (a group that would outgrow either goes at
once and a new one opens). A result for a reply topic, or of no batch, goes alone as version 1:
direct Kafka clients read one result per message.

Each caller waits for its own group's acknowledgement; a publish the broker refuses or does not
confirm is tried again (bounded, random exponential backoff), and when every try fails each
caller of the group gets the error (its line's offset is then never committed).

A reply topic is a pipeline's: a refusal that concerns only that topic or that record
(``UNDELIVERABLE``: an invalid or unknown topic, no authorization, a record too large) is not
tried again and raises ``Undeliverable``, which the consumer turns into a dead letter, so no
pipeline's topic can stop a worker. A broker that does not answer is retried and then stops the
worker, for any topic.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.errors import (
    InvalidTopicError,
    KafkaError,
    MessageSizeTooLargeError,
    PolicyViolationError,
    RecordListTooLargeError,
    RecordTooLargeError,
    TopicAuthorizationFailedError,
    UnknownTopicOrPartitionError,
)
from tenacity import AsyncRetrying, RetryCallState, stop_after_attempt, wait_random_exponential

from services.inference import metrics
from shared.errors import ECHO_CHARS
from shared.protocol.messages import RESULT_COUNT_HEADER, DeadLetter, ResultMessage, result_group_json
from shared.retries import RetryRule, first_then_retrying

log = logging.getLogger(__name__)

GROUP_MAX_RESULTS = 1_000
GROUP_MAX_BYTES = 512 * 1024
"""Below Kafka's default limit on a message (1 MiB), so a broker with defaults takes any group."""
PUBLISH_RETRY: RetryRule[Any] = RetryRule(errors=(KafkaError,))
TOO_LARGE: tuple[type[Exception], ...] = (
    MessageSizeTooLargeError,
    RecordListTooLargeError,
    RecordTooLargeError,
)
"""Refusals of one record for its size: another try gets the same answer."""
UNDELIVERABLE: tuple[type[Exception], ...] = (
    InvalidTopicError,
    UnknownTopicOrPartitionError,  # aiokafka raises it once the topic stayed unknown for its timeout
    TopicAuthorizationFailedError,
    PolicyViolationError,
    *TOO_LARGE,
)
"""Refusals of one topic or one record: a reply topic's are not retried (``Undeliverable``)."""
REPLY_RETRY: RetryRule[Any] = RetryRule(errors=(KafkaError,), except_errors=UNDELIVERABLE)
ALONE_RETRY: RetryRule[Any] = RetryRule(errors=(KafkaError,), except_errors=TOO_LARGE)


class Undeliverable(Exception):
    """The broker refused a reply for its topic or its record (not for being unreachable)."""


@dataclass
class _Group:
    topic: str
    batch_id: str
    values: list[bytes] = field(default_factory=list)
    size: int = 0
    # One future per caller, not one shared: a caller cancelled (a drain that timed out) cancels
    # only its own (and costs less than ``asyncio.shield`` on the shared one).
    waiters: list[asyncio.Future[None]] = field(default_factory=list)

    def settle(self, error: Exception | None) -> None:
        for waiter in self.waiters:
            if waiter.done():  # its caller was cancelled
                continue
            if error is None:
                waiter.set_result(None)
            else:
                waiter.set_exception(error)

    def fits(self, value: bytes) -> bool:
        return len(self.values) < GROUP_MAX_RESULTS and self.size + len(value) <= GROUP_MAX_BYTES


@dataclass
class _Slot:
    """One batch's results on one topic: the group gathering, and how many are being sent."""

    open: _Group | None = None
    sending: int = 0


class ResultPublisher:
    def __init__(self, producer: AIOKafkaProducer, *, attempts: int, retry_max_wait_s: float) -> None:
        self.producer = producer
        self.attempts = max(1, attempts)
        self.retry_max_wait_s = retry_max_wait_s
        self._slots: dict[tuple[str, str], _Slot] = {}
        self._sends: set[asyncio.Task[None]] = set()

    async def reply(self, result: ResultMessage, topic: str, *, where: str) -> None:
        """Publish ``result`` alone on the reply topic ``topic`` and wait for the broker's
        acknowledgement. Raises ``Undeliverable`` when the broker refuses it for that topic or
        record; any other last failure propagates."""
        context = {"request_id": result.request_id[:ECHO_CHARS], "at": where}
        try:
            key = (result.batch_id or result.request_id).encode()
            await self._send(topic, key, result.to_json(), 1, context, REPLY_RETRY)
        except UNDELIVERABLE as exc:
            raise Undeliverable(f"{type(exc).__name__}: {exc}") from exc

    async def dead_letter(self, letter: DeadLetter, topic: str, *, where: str) -> None:
        """Publish ``letter`` on the dead-letter topic ``topic``, retried like a result."""
        value = letter.to_json()
        await self._send(topic, None, value, 0, {"reason": letter.reason, "at": where})

    async def publish(self, result: ResultMessage, topic: str, *, group: bool, where: str) -> None:
        """Publish ``result`` on ``topic`` and wait for the broker's acknowledgement; ``group``:
        it may travel with others of its batch. A result sent alone that is too large for the
        broker raises ``Undeliverable`` (a group stays under any broker's default limit); any
        other last failure propagates."""
        value = result.to_json()
        if not group or result.batch_id is None or len(value) > GROUP_MAX_BYTES:
            key = (result.batch_id or result.request_id).encode()
            context = {"batch_id": result.batch_id, "at": where}
            try:
                await self._send(topic, key, value, 1, context, ALONE_RETRY)
            except TOO_LARGE as exc:
                raise Undeliverable(f"{type(exc).__name__}: {len(value)} bytes") from exc
            return
        slot = self._slots.setdefault((topic, result.batch_id), _Slot())
        joined = slot.open
        if joined is not None and not joined.fits(value):
            slot.open = None
            self._launch(slot, joined)  # full: it goes now, a new group opens
            joined = None
        if joined is None:
            joined = slot.open = _Group(topic, result.batch_id)
            if not slot.sending:  # gather what else finishes in this turn of the loop
                asyncio.get_running_loop().call_soon(self._send_open, slot)
        joined.values.append(value)
        joined.size += len(value)
        waiter = asyncio.get_running_loop().create_future()
        joined.waiters.append(waiter)
        await waiter

    def _send_open(self, slot: _Slot) -> None:
        if slot.open is not None and not slot.sending:
            group, slot.open = slot.open, None
            self._launch(slot, group)

    def _launch(self, slot: _Slot, group: _Group) -> None:
        slot.sending += 1
        task = asyncio.create_task(self._send_group(slot, group))
        self._sends.add(task)
        task.add_done_callback(self._sends.discard)

    async def _send_group(self, slot: _Slot, group: _Group) -> None:
        count = len(group.values)
        value = group.values[0] if count == 1 else result_group_json(group.batch_id, group.values)
        try:
            await self._send(group.topic, group.batch_id.encode(), value, count, {"batch_id": group.batch_id})
        except asyncio.CancelledError:
            for waiter in group.waiters:
                waiter.cancel()
            raise
        except Exception as exc:
            group.settle(exc)
        else:
            group.settle(None)
        finally:
            slot.sending -= 1
            if slot.open is not None:
                self._send_open(slot)  # what gathered meanwhile
            elif not slot.sending:
                self._slots.pop((group.topic, group.batch_id), None)

    async def _send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes,
        count: int,
        context: dict[str, Any],
        rule: RetryRule[Any] = PUBLISH_RETRY,
    ) -> None:
        """Send one message of ``count`` results (0: not a result), trying again while the broker
        refuses it in a way ``rule`` retries."""
        if count:
            metrics.RESULTS_PER_MESSAGE.observe(count)
        headers = [(RESULT_COUNT_HEADER, str(count).encode())] if count > 1 else None
        context = {**context, "results": count}

        def before_sleep(state: RetryCallState) -> None:
            metrics.PUBLISH_RETRIES.inc()
            error = state.outcome.exception() if state.outcome else None
            log.warning("publishing results failed (try %d): %r", state.attempt_number, error, extra=context)

        def retrying() -> AsyncRetrying:  # built only when the first try failed
            return AsyncRetrying(
                stop=stop_after_attempt(self.attempts),
                wait=wait_random_exponential(multiplier=0.2, max=self.retry_max_wait_s),
                before_sleep=before_sleep,
                reraise=True,
            )

        async def attempt() -> Any:
            return await self.producer.send_and_wait(topic, value, key=key, headers=headers)

        try:
            await first_then_retrying(attempt, rule, retrying)
        except KafkaError as exc:
            if isinstance(exc, rule.except_errors):  # refused for its topic or record: the caller's
                log.warning("a result was refused: %r", exc, extra=context)
                raise
            metrics.PUBLISH_FAILURES.inc()
            log.error("publishing results failed for good; stopping uncommitted", extra=context)
            raise
