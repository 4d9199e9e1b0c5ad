"""The messages around the request and result: batch facts on the control topic, and the
dead letters of request messages a worker did not run or could not answer."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from shared.protocol.wire import ENCODER, SCHEMA_VERSION


class ControlMessage(msgspec.Struct, kw_only=True):
    """Batch facts workers need without a database call, on the compacted control topic."""

    schema_version: Literal[1] = SCHEMA_VERSION
    batch_id: str
    model: str | None = None
    total: int | None = None
    expires_at: float | None = None
    cancelled: bool = False

    def to_json(self) -> bytes:
        return ENCODER.encode(self)


DeadLetterReason = Literal[
    "invalid_message",
    "batch_not_verified",
    "reply_topic_missing",
    "reply_topic_invalid",
    "reply_topic_internal",
    "reply_undeliverable",
]
"""Why a worker dead-lettered a request message (also the label of its counter)."""
DEAD_LETTER_VALUE_BYTES = 4096
"""Most bytes of the original message a dead letter holds (``value``)."""
BATCH_NOT_VERIFIED_CODE = "batch_not_verified"
BATCH_NOT_VERIFIED_MESSAGE = (
    "This request was not run: only the api may name a batch_id (its messages are signed); "
    "leave batch_id and line null."
)

RESULT_TOO_LARGE_CODE = "result_too_large"
RESULT_TOO_LARGE_MESSAGE = "This request's result was larger than the broker accepts ({detail})."


class DeadLetter(msgspec.Struct, kw_only=True):
    """A request message a worker did not run or could not answer, on the dead-letter topic."""

    schema_version: Literal[1] = SCHEMA_VERSION
    reason: DeadLetterReason
    detail: Annotated[str, msgspec.Meta(description="What was wrong, in words.")]
    topic: Annotated[str, msgspec.Meta(description="Where the message was read.")]
    partition: int
    offset: int
    request_id: Annotated[str | None, msgspec.Meta(description="The message's, when it names one.")] = None
    reply_topic: Annotated[str | None, msgspec.Meta(description="The message's, when a string.")] = None
    value: Annotated[
        str,
        msgspec.Meta(
            description=f"The message's value as UTF-8 text (bad bytes replaced), its first "
            f"{DEAD_LETTER_VALUE_BYTES} bytes."
        ),
    ]
    value_bytes: Annotated[int, msgspec.Meta(description="The message's whole size in bytes.")]

    def to_json(self) -> bytes:
        return ENCODER.encode(self)
