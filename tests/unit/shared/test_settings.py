"""Settings that refuse a bad start themselves, whoever builds them."""

from __future__ import annotations

import pydantic
import pytest

from shared.settings import DEV_API_KEY, MongoSettings, RuntimeSettings


def test_outside_development_the_local_secrets_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BATCHSTREAM_ENVIRONMENT", "production")
    with pytest.raises(pydantic.ValidationError, match="BATCHSTREAM_API_KEYS"):
        RuntimeSettings()
    monkeypatch.setenv("BATCHSTREAM_API_KEYS", "sk-own")
    monkeypatch.setenv("BATCHSTREAM_S3_SECRET_KEY", "own-secret")
    with pytest.raises(pydantic.ValidationError, match="BATCHSTREAM_KAFKA_SIGNING_KEY"):
        RuntimeSettings()
    monkeypatch.setenv("BATCHSTREAM_KAFKA_SIGNING_KEY", "own-signing-key-of-this-deployment")
    assert not RuntimeSettings().is_development


def test_in_development_the_local_secrets_are_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BATCHSTREAM_ENVIRONMENT", "test")
    monkeypatch.setenv("BATCHSTREAM_API_KEYS", DEV_API_KEY)
    assert RuntimeSettings().is_development


def test_a_mongo_uri_is_checked_and_kept_as_written() -> None:
    uri = "mongodb://user:pw@a:27017,b:27017/?replicaSet=rs0"
    assert MongoSettings(uri=uri).uri == uri
    with pytest.raises(pydantic.ValidationError, match="mongodb"):
        MongoSettings(uri="127.0.0.1:27117")
