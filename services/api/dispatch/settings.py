"""The dispatcher's settings (``BATCHSTREAM_DISPATCH_*``); only the api reads them."""

from __future__ import annotations

from pydantic import field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class DispatchSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="BATCHSTREAM_DISPATCH_", frozen=True, extra="ignore")

    # A dispatch round: at most this many lines per model, every ``round_seconds`` (sooner when a
    # batch becomes dispatchable on this replica).
    round_lines: int = 512
    round_seconds: float = 0.05
    # How often the queued batches are read from MongoDB (status, cancellation, new batches).
    refresh_seconds: float = 0.25
    # Lines a batch that has not started yet gets ahead of the order in its first round.
    start_lines: int = 32
    # Lines one project takes per fair-share turn.
    quantum_lines: int = 16
    # Batches whose deadlines (expires_at) lie within this many seconds of the earliest share a tier.
    deadline_resolution_s: float = 600.0
    # "project=weight,..." for the fair share; unnamed projects weigh ``default_project_weight``.
    project_weights: str = ""
    default_project_weight: float = 1.0
    # Weight of direct-Kafka requests (pipelines) against batch lines (weight 1) in the topic.
    direct_weight: float = 1.0
    # The topic backlog target: each consumer-group member's in-flight window, plus what the
    # group finishes in ``backlog_seconds``, never below ``min_backlog``.
    worker_window: int = 128
    backlog_seconds: float = 0.5
    min_backlog: int = 64
    max_backlog: int = 20_000
    # How long a finished line stays in the measured backlog: the workers commit every 0.5 s.
    commit_lag_s: float = 0.7
    # The inference consumer group of a model: this prefix plus the model's topic slug.
    group_prefix: str = "batchstream-inference-"
    meter_seconds: float = 0.2
    # One active dispatcher per model: a lease in MongoDB renewed every ``lease_renew_s``.
    lease_ttl_s: float = 5.0
    lease_renew_s: float = 1.0
    # A batch's read position reaches MongoDB at most this often (and when it is done).
    position_flush_s: float = 1.0
    # A line consumed and committed past with no result after ``grace_s`` is sent again, at most
    # ``max_attempts`` times in all; then it gets a ``line_lost`` error line.
    grace_s: float = 15.0
    max_attempts: int = 3
    # After a takeover, lines an earlier dispatcher sent that still lack a result after this are
    # sent again (their offsets died with it).
    takeover_grace_s: float = 30.0
    journey_check_seconds: float = 1.0

    @field_validator("project_weights")
    @classmethod
    def _weights_parse(cls, value: str) -> str:
        parse_weights(value)
        return value

    def weights(self) -> dict[str, float]:
        return parse_weights(self.project_weights)


def parse_weights(text: str) -> dict[str, float]:
    """``"a=2,b=0.5"`` -> ``{"a": 2.0, "b": 0.5}``; a weight must be positive."""
    weights: dict[str, float] = {}
    for item in text.split(","):
        if not item.strip():
            continue
        name, sep, raw = item.partition("=")
        weight = float(raw) if sep else 0.0
        if not name.strip() or weight <= 0:
            raise ValueError(f"bad project weight {item!r}: write project=positive number")
        weights[name.strip()] = weight
    return weights
