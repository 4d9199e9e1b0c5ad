"""Request messages as the api's dispatcher signs them, for tests that publish batch lines."""

from __future__ import annotations

from shared.request_signing import RequestSigner
from shared.settings import KafkaSettings


def api_headers(settings: KafkaSettings, topic: str, value: bytes) -> list[tuple[str, bytes]]:
    """The headers the dispatcher puts on a batch line's request message ``value`` for ``topic``."""
    return RequestSigner(settings.signing_key).headers(topic, value)
