"""Every Kafka client reaches the cluster the same way: plain locally, a SASL user (and TLS) on a
shared cluster with ACLs."""

from __future__ import annotations

import ssl

import pydantic
import pytest
from faust.auth import SASLCredentials

from services.aggregator.app import broker_credentials
from shared.kafka import connection
from shared.settings import KafkaSettings


def test_the_local_stack_connects_in_plain_text() -> None:
    assert connection(KafkaSettings(bootstrap_servers="b:9092")) == {
        "bootstrap_servers": "b:9092",
        "security_protocol": "PLAINTEXT",
    }
    assert broker_credentials(KafkaSettings()) is None


def test_a_sasl_user_over_tls_reaches_every_client() -> None:
    kafka = KafkaSettings(
        bootstrap_servers="b:9093",
        security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username="inference",
        sasl_password="s3cret-but-long-enough",
    )
    options = connection(kafka)
    assert options["security_protocol"] == "SASL_SSL"
    assert (options["sasl_mechanism"], options["sasl_plain_username"]) == ("SCRAM-SHA-512", "inference")
    assert isinstance(options["ssl_context"], ssl.SSLContext)
    credentials = broker_credentials(kafka)  # the aggregator's faust app: the same user
    assert isinstance(credentials, SASLCredentials)
    assert (credentials.username, credentials.protocol.value) == ("inference", "SASL_SSL")


def test_sasl_without_a_user_stops_the_start() -> None:
    with pytest.raises(pydantic.ValidationError, match="BATCHSTREAM_KAFKA_SASL_USERNAME"):
        KafkaSettings(security_protocol="SASL_PLAINTEXT")
    with pytest.raises(pydantic.ValidationError):
        KafkaSettings(security_protocol="KERBEROS")  # type: ignore[arg-type]
    assert "s3cret" not in repr(
        KafkaSettings(security_protocol="SASL_PLAINTEXT", sasl_username="u", sasl_password="s3cret")
    )
