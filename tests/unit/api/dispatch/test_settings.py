"""DispatchSettings: timers that would keep the dispatcher's loop from resting are refused."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from services.api.dispatch.settings import DispatchSettings

TIMERS = ("refresh_seconds", "meter_seconds", "lease_renew_s", "position_flush_s", "journey_check_seconds")


@pytest.mark.parametrize("timer", TIMERS)
def test_a_zero_timer_is_refused_with_its_name(timer: str) -> None:
    with pytest.raises(ValidationError, match=timer):
        DispatchSettings(**{timer: 0})


def test_the_defaults_and_a_short_timer_are_accepted() -> None:
    assert DispatchSettings().refresh_seconds == 0.25
    assert DispatchSettings(meter_seconds=0.01).meter_seconds == 0.01


def test_project_tiers_parse_like_the_weights_and_refuse_what_is_not_an_integer() -> None:
    assert DispatchSettings(project_tiers="ops=1, bulk=-1,").tiers() == {"ops": 1, "bulk": -1}
    assert DispatchSettings().tiers() == {}
    for bad in ("ops", "ops=high", "ops=1.5", "=2"):
        with pytest.raises(ValidationError, match="project_tiers"):
            DispatchSettings(project_tiers=bad)


def test_project_weights_parse_and_refuse_what_is_not_a_positive_number() -> None:
    assert DispatchSettings(project_weights="a=2, b=0.5,").weights() == {"a": 2.0, "b": 0.5}
    for bad in ("a", "a=0", "a=-1", "a=x", "=2"):
        with pytest.raises(ValidationError, match="bad project weight"):
            DispatchSettings(project_weights=bad)
