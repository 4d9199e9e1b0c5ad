"""Quota settings: defaults, per-project overrides, and bad values that stop the api."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from services.api.quotas.settings import ProjectLimits, QuotaSettings


def test_a_project_without_an_override_gets_the_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BATCHSTREAM_QUOTA_ENQUEUED_TOKENS", "900")
    limits = QuotaSettings().limits("anyone")
    assert limits == ProjectLimits(
        queued_lines=0,
        enqueued_tokens=900,
        stored_bytes=0,
        batches_in_progress=1000,
        concurrent_validations=32,
    )


def test_an_override_replaces_only_the_fields_it_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BATCHSTREAM_QUOTA_STORED_BYTES", "1000")
    monkeypatch.setenv(
        "BATCHSTREAM_QUOTA_PROJECTS", '{"team-a": {"enqueued_tokens": 5000000, "stored_bytes": 0}}'
    )
    settings = QuotaSettings()
    team_a = settings.limits("team-a")
    assert team_a.enqueued_tokens == 5_000_000
    assert team_a.stored_bytes == 0  # unlimited for team-a
    assert team_a.batches_in_progress == 1000  # the default kept
    assert settings.limits("team-b").stored_bytes == 1000


@pytest.mark.parametrize(
    "projects",
    [
        '{"team-a": {"enqueued_token": 5}}',  # a misspelled limit
        '{"team-a": {"queued_lines": -1}}',
        '{"team-a": {"stored_bytes": "lots"}}',
        '{"team-a": 5}',
        "not json",
    ],
)
def test_a_bad_override_is_refused_naming_it(monkeypatch: pytest.MonkeyPatch, projects: str) -> None:
    monkeypatch.setenv("BATCHSTREAM_QUOTA_PROJECTS", projects)
    with pytest.raises((ValidationError, ValueError)) as refused:
        QuotaSettings()
    assert "projects" in str(refused.value)


def test_a_negative_default_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BATCHSTREAM_QUOTA_QUEUED_LINES", "-5")
    with pytest.raises(ValidationError, match="queued_lines"):
        QuotaSettings()


def test_empty_variables_keep_the_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    """docker compose passes an unset quota as an empty string."""
    monkeypatch.setenv("BATCHSTREAM_QUOTA_CONCURRENT_VALIDATIONS", "")
    monkeypatch.setenv("BATCHSTREAM_QUOTA_PROJECTS", "")
    settings = QuotaSettings()
    assert settings.concurrent_validations == QuotaSettings.model_fields["concurrent_validations"].default
    assert settings.projects == {}
