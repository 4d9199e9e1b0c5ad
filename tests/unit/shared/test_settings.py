"""Settings that refuse a bad start themselves, whoever builds them."""

from __future__ import annotations

import pydantic
import pytest

from shared.settings import DEV_API_KEY, DEV_S3_SECRET, ApiSettings, MongoSettings, RuntimeSettings

STRONG_KEY = "sk-bs-4f9c2a7e1d8b3c6a5f0e9d2c"
STRONG_S3 = "Zr8qL2vX9mN4pT7wK1yB6"


def test_outside_development_the_local_secrets_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BATCHSTREAM_ENVIRONMENT", "production")
    with pytest.raises(pydantic.ValidationError, match="BATCHSTREAM_API_KEYS"):
        RuntimeSettings()
    monkeypatch.setenv("BATCHSTREAM_API_KEYS", STRONG_KEY)
    monkeypatch.setenv("BATCHSTREAM_S3_SECRET_KEY", STRONG_S3)
    with pytest.raises(pydantic.ValidationError, match="BATCHSTREAM_KAFKA_SIGNING_KEY"):
        RuntimeSettings()
    monkeypatch.setenv("BATCHSTREAM_KAFKA_SIGNING_KEY", "own-signing-key-of-this-deployment")
    assert not RuntimeSettings().is_development


@pytest.mark.parametrize(
    ("keys", "why"),
    [
        (f"{DEV_API_KEY},{STRONG_KEY}=prod", "#1 of BATCHSTREAM_API_KEYS is the local"),
        (f"{STRONG_KEY}=prod, {DEV_API_KEY}", "#2 of BATCHSTREAM_API_KEYS is the local"),
        (f" {DEV_API_KEY}", "is the local"),
        (f"{DEV_API_KEY}=default", "is the local"),
        (f"{DEV_API_KEY} =default", "is the local"),
        ("replace-me", "is a placeholder"),
        ("CHANGEME=prod", "is a placeholder"),
        ("secret-123", "is a placeholder"),
        ("sk-own", "shorter than 20"),
        (" , ", "holds no key"),
    ],
)
def test_outside_development_each_weak_key_is_refused_alone(
    monkeypatch: pytest.MonkeyPatch, keys: str, why: str
) -> None:
    monkeypatch.setenv("BATCHSTREAM_ENVIRONMENT", "production")
    monkeypatch.setenv("BATCHSTREAM_S3_SECRET_KEY", STRONG_S3)
    monkeypatch.setenv("BATCHSTREAM_API_KEYS", keys)
    with pytest.raises(pydantic.ValidationError, match=why) as raised:
        RuntimeSettings()
    assert DEV_API_KEY not in str(raised.value)  # a secret is never echoed


@pytest.mark.parametrize("secret", ["replace-me", DEV_S3_SECRET, "short-secret"])
def test_outside_development_a_weak_s3_secret_is_refused(
    monkeypatch: pytest.MonkeyPatch, secret: str
) -> None:
    monkeypatch.setenv("BATCHSTREAM_ENVIRONMENT", "production")
    monkeypatch.setenv("BATCHSTREAM_API_KEYS", STRONG_KEY)
    monkeypatch.setenv("BATCHSTREAM_S3_SECRET_KEY", secret)
    with pytest.raises(pydantic.ValidationError, match="BATCHSTREAM_S3_SECRET_KEY"):
        RuntimeSettings()


def test_a_key_and_its_project_are_read_without_spaces(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BATCHSTREAM_API_KEYS", f" {STRONG_KEY} = prod ,{STRONG_KEY}x")
    assert ApiSettings().project_by_key() == {STRONG_KEY: "prod", f"{STRONG_KEY}x": "default"}


def test_in_development_the_local_secrets_are_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BATCHSTREAM_ENVIRONMENT", "test")
    monkeypatch.setenv("BATCHSTREAM_API_KEYS", DEV_API_KEY)
    assert RuntimeSettings().is_development


def test_a_mongo_uri_is_checked_and_kept_as_written() -> None:
    uri = "mongodb://user:pw@a:27017,b:27017/?replicaSet=rs0"
    assert MongoSettings(uri=uri).uri == uri
    with pytest.raises(pydantic.ValidationError, match="mongodb"):
        MongoSettings(uri="127.0.0.1:27117")


def test_outside_development_a_weak_kafka_password_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BATCHSTREAM_ENVIRONMENT", "production")
    monkeypatch.setenv("BATCHSTREAM_API_KEYS", STRONG_KEY)
    monkeypatch.setenv("BATCHSTREAM_S3_SECRET_KEY", STRONG_S3)
    monkeypatch.setenv("BATCHSTREAM_KAFKA_SIGNING_KEY", "own-signing-key-of-this-deployment")
    monkeypatch.setenv("BATCHSTREAM_KAFKA_SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("BATCHSTREAM_KAFKA_SASL_USERNAME", "api")
    monkeypatch.setenv("BATCHSTREAM_KAFKA_SASL_PASSWORD", "replace-me")  # the Kubernetes placeholder
    with pytest.raises(pydantic.ValidationError, match="BATCHSTREAM_KAFKA_SASL_PASSWORD is a placeholder"):
        RuntimeSettings()
    monkeypatch.setenv("BATCHSTREAM_KAFKA_SASL_PASSWORD", STRONG_S3)
    assert not RuntimeSettings().is_development
