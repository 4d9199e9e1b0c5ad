"""What every Kafka message shares: its schema versions and how a typed message is read.

Each message is one msgspec ``Struct`` whose annotations carry its constraints: the same class
is what a service builds, what msgspec encodes and decodes on the hot path, and what the JSON
Schema of docs/schemas/ is generated from (``shared.protocol.schemas``). A message is read
strictly first (every message a service writes); anything else is read again in lax mode (a
number in a string is taken, as a pipeline's JSON library may write it), and what fails both
raises ``msgspec.ValidationError``, worded by ``error_detail``.
"""

from __future__ import annotations

import re
from typing import Any, Literal, TypeVar

import msgspec

SCHEMA_VERSION: Literal[1] = 1
RESULT_GROUP_VERSION: Literal[2] = 2
"""A results-topic message of this version holds several version-1 results of one batch."""

T = TypeVar("T")

ENCODER = msgspec.json.Encoder()
"""Compact JSON, fields in their declared order, ``msgspec.Raw`` values written as they are."""

_AT = re.compile(r" - at `\$\.?(?P<path>[^`]*)`$")


def convert(value: Any, kind: type[T]) -> T:
    """``value`` (decoded JSON) as a ``kind``, its scalar types coerced where the meaning is
    plain (``"7"`` for a line number); raises ``msgspec.ValidationError``."""
    return msgspec.convert(value, kind, strict=False)


def error_detail(exc: msgspec.MsgspecError) -> str:
    """``path: what is wrong`` (``message`` for the message as a whole)."""
    text = str(exc)
    found = _AT.search(text)
    if found is None:
        return f"message: {text}"
    path = found["path"].replace("[", ".").replace("]", "") or "message"
    return f"{path}: {text[: found.start()]}"
