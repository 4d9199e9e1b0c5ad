"""The api's signature on a batch line: it verifies for the same key, topic and bytes only."""

from __future__ import annotations

from shared.request_signing import SIGNATURE_HEADER, RequestSigner

TOPIC = "requests.gemma-3-270m"
VALUE = b'{"schema_version":1,"request_id":"batch_req_1","batch_id":"batch_a","line":1}'


def test_a_signed_message_verifies_with_the_same_key() -> None:
    signer = RequestSigner("a-key-of-sixteen-or-more")
    headers = signer.headers(TOPIC, VALUE)
    assert [name for name, _ in headers] == [SIGNATURE_HEADER]
    assert headers[0][1].startswith(b"v1=") and len(headers[0][1]) == 3 + 64
    assert signer.verified(TOPIC, VALUE, headers)
    assert RequestSigner("a-key-of-sixteen-or-more").verified(TOPIC, VALUE, headers)  # no state kept


def test_another_key_topic_or_byte_does_not_verify() -> None:
    signer = RequestSigner("a-key-of-sixteen-or-more")
    headers = signer.headers(TOPIC, VALUE)
    assert not RequestSigner("another-key-of-sixteen").verified(TOPIC, VALUE, headers)
    assert not signer.verified("requests.other-model", VALUE, headers)  # moved to another model
    assert not signer.verified(TOPIC, VALUE.replace(b'"line":1', b'"line":2'), headers)  # another line
    assert not signer.verified(TOPIC, VALUE.replace(b"batch_a", b"batch_b"), headers)  # another batch


def test_no_header_or_a_malformed_one_does_not_verify() -> None:
    signer = RequestSigner("a-key-of-sixteen-or-more")
    assert not signer.verified(TOPIC, VALUE, None)
    assert not signer.verified(TOPIC, VALUE, [])
    assert not signer.verified(TOPIC, VALUE, [(SIGNATURE_HEADER, b"v1=00")])
    assert not signer.verified(TOPIC, VALUE, [(SIGNATURE_HEADER, None)])  # type: ignore[list-item]
    good = signer.headers(TOPIC, VALUE)
    assert signer.verified(TOPIC, VALUE, [("other", b"x"), (SIGNATURE_HEADER, b"v1=bad"), *good])
