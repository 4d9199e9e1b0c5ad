"""Versioned Kafka messages: the public request schema and the internal result/control facts.

A message is one JSON object with ``schema_version``. Consumers accept the versions they know and
reject others with a clear error; fields are only ever added within a version. Each message is
defined once, as a msgspec ``Struct`` in its own module (shared/protocol/wire.py says how they
are read); this module is their index.
"""

from __future__ import annotations

from shared.protocol.request_message import RequestMessage, read_request
from shared.protocol.result_message import (
    NOT_RUN_MESSAGES,
    RESULT_COUNT_HEADER,
    LineError,
    NotRunCode,
    OutputLine,
    ResponsePayload,
    ResultGroup,
    ResultMessage,
    TokenUsage,
    raw_json,
    result_count,
    result_group_json,
    result_values,
)
from shared.protocol.sampling import RequestDefaults, SamplingDefaults, message_defaults
from shared.protocol.wire import RESULT_GROUP_VERSION, SCHEMA_VERSION, error_detail
from shared.protocol.worker_messages import (
    BATCH_NOT_VERIFIED_CODE,
    BATCH_NOT_VERIFIED_MESSAGE,
    DEAD_LETTER_VALUE_BYTES,
    RESULT_TOO_LARGE_CODE,
    RESULT_TOO_LARGE_MESSAGE,
    ControlMessage,
    DeadLetter,
    DeadLetterReason,
)

__all__ = [
    "BATCH_NOT_VERIFIED_CODE",
    "BATCH_NOT_VERIFIED_MESSAGE",
    "DEAD_LETTER_VALUE_BYTES",
    "NOT_RUN_MESSAGES",
    "RESULT_COUNT_HEADER",
    "RESULT_GROUP_VERSION",
    "RESULT_TOO_LARGE_CODE",
    "RESULT_TOO_LARGE_MESSAGE",
    "SCHEMA_VERSION",
    "ControlMessage",
    "DeadLetter",
    "DeadLetterReason",
    "LineError",
    "NotRunCode",
    "OutputLine",
    "RequestDefaults",
    "RequestMessage",
    "ResponsePayload",
    "ResultGroup",
    "ResultMessage",
    "SamplingDefaults",
    "TokenUsage",
    "error_detail",
    "message_defaults",
    "raw_json",
    "read_request",
    "result_count",
    "result_group_json",
    "result_values",
]
