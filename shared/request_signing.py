"""The api's proof on a batch line's request message: an HMAC-SHA256 in a Kafka header.

A request message that names a ``batch_id`` is counted for that batch, so a worker runs it for
the batch only when it carries this proof (docs/kafka-protocol.md#signed-batch-lines). The
dispatcher signs the message's value exactly as sent, and the topic it is sent to:

- the value holds the line's place (``batch_id``, ``line``), the output line's ``id``
  (``request_id``), the batch's ``project`` (its share of a worker's engine) and what runs
  (``body``, ``defaults``, ``expires_at``): none can be changed, so a signed message cannot be
  turned into another line or another request, nor take another project's share;
- the topic names the model, so a signed message cannot be moved to another model's workers.

It travels in a header, not in the JSON, because it signs the value's bytes (a field inside the
value would need a canonical form of the rest); the request schema is unchanged. A replayed
signed message runs the same line again, which the aggregator counts once.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable

SIGNATURE_HEADER = "batchstream-signature"
"""Kafka header of a signed request message: ``v1=`` and the hex HMAC-SHA256."""
_PREFIX = b"v1="
_CONTEXT = b"batchstream-request-message\n"
TOPICS_KEPT = 1024
"""Topics whose started MAC is kept (a worker reads one model's topic; the api writes each model's)."""


class RequestSigner:
    """Signs and checks request messages with one key (``KafkaSettings.signing_key``)."""

    def __init__(self, key: str) -> None:
        self._mac = hmac.new(key.encode(), _CONTEXT, hashlib.sha256)
        self._topics: dict[str, hmac.HMAC] = {}  # the MAC over the context and a topic: copied per message

    def signature(self, topic: str, value: bytes) -> bytes:
        """``v1=<hex HMAC-SHA256 of the topic and the value>``."""
        mac = self._topics.get(topic)
        if mac is None:
            if len(self._topics) >= TOPICS_KEPT:
                self._topics.clear()
            mac = self._topics[topic] = self._mac.copy()
            mac.update(topic.encode() + b"\n")
        mac = mac.copy()
        mac.update(value)
        return _PREFIX + mac.hexdigest().encode()

    def headers(self, topic: str, value: bytes) -> list[tuple[str, bytes]]:
        """The headers of a signed message."""
        return [(SIGNATURE_HEADER, self.signature(topic, value))]

    def verified(self, topic: str, value: bytes, headers: Iterable[tuple[str, bytes]] | None) -> bool:
        """True when one of the message's signature headers is this key's for ``topic`` and
        ``value`` (compared in constant time)."""
        given = [raw for name, raw in headers or () if name == SIGNATURE_HEADER]
        if not given:
            return False
        expected = self.signature(topic, value)
        return any(isinstance(raw, bytes) and hmac.compare_digest(expected, raw) for raw in given)
