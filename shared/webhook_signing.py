"""Standard Webhooks signatures (https://www.standardwebhooks.com): the headers of one attempt.

The signed content is ``{webhook-id}.{webhook-timestamp}.{body}``; the key is the base64 after
the secret's ``whsec_`` prefix; ``webhook-signature`` is ``v1,<base64 HMAC-SHA256>`` (a receiver
accepts any of the space-separated signatures, which allows rotating secrets later).
"""

from __future__ import annotations

import base64
import hashlib
import hmac

from shared.settings import WEBHOOK_SECRET_PREFIX


def secret_key(secret: str) -> bytes:
    """The HMAC key of a ``whsec_<base64>`` secret."""
    return base64.b64decode(secret.removeprefix(WEBHOOK_SECRET_PREFIX))


def sign(secret: str, message_id: str, timestamp: int, body: bytes) -> str:
    """``v1,<base64 HMAC-SHA256 of id.timestamp.body>``."""
    signed = f"{message_id}.{timestamp}.".encode() + body
    digest = hmac.new(secret_key(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def signature_headers(secret: str, message_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The three Standard Webhooks headers plus the content type."""
    return {
        "content-type": "application/json",
        "webhook-id": message_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": sign(secret, message_id, timestamp, body),
    }


def verify(secret: str, message_id: str, timestamp: int, body: bytes, signature_header: str) -> bool:
    """True when one of the header's space-separated ``v1,`` signatures matches (constant time)."""
    expected = sign(secret, message_id, timestamp, body)
    return any(hmac.compare_digest(expected, given) for given in signature_header.split())
