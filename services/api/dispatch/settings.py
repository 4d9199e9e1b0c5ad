"""The dispatcher's settings (``BATCHSTREAM_DISPATCH_*``); only the api reads them."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from pydantic import Field, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from shared.settings import WORKER_COMMIT_INTERVAL_S

T = TypeVar("T")

# The loop's pause is the shortest of its timers (refresh, meter, lease, positions, journeys): each
# is at least this, so the loop always rests.
SHORTEST_TIMER_S = 0.01


class DispatchSettings(BaseSettings):
    """The api's dispatcher: how lines go from object storage to the models' topics."""

    model_config = SettingsConfigDict(
        env_prefix="BATCHSTREAM_DISPATCH_", frozen=True, extra="ignore", use_attribute_docstrings=True
    )

    prefix_order: bool = True
    """Send a batch's lines in its prefix order (``order.py``): lines sharing a long prompt prefix
    together, so vLLM's prefix cache computes each prefix about once. Off: file order for every
    batch; a batch may also opt out at create (``prefix_order: false``)."""
    longest_first: bool = True
    """Within a batch's dispatch order, send the lines expected to run longest first (by their
    ``max_tokens``, ``max_completion_tokens`` or the batch's ``max_decoding_length``; embeddings,
    score and rerank are short), ordering the prefix groups by their longest line and the lines
    in a group, without breaking a group. On a GPU this keeps long lines from running alone at
    the end (the tail). Off: groups by their first line, lines in file order. Applies to batches
    sent in a dispatch order (``prefix_order``)."""
    prefix_min_shared_chars: int = Field(default=256, ge=1)
    """Lines form a prefix group when their prompts share at least this many characters (about
    a quarter as many tokens)."""
    affinity: bool = True
    """Send a prefix group's lines to one partition of the requests topic (one worker, whose KV
    cache then holds the prefix), chosen by the prefix's hash, unless that partition holds more
    than ``affinity_slack_lines`` more lines than the emptiest (then the emptiest)."""
    affinity_slice_lines: int = Field(default=64, ge=1)
    """A larger group is cut into slices of this many lines, each placed on its own, so one large
    group spreads over the workers (each computes the prefix once)."""
    affinity_slack_lines: int = Field(default=64, ge=0)
    """How much fuller than the emptiest partition the preferred one may be before a new slice
    goes elsewhere (no worker idles while another has a queue)."""
    round_lines: int = 512
    """Most lines one dispatch round sends per model."""
    refresh_seconds: float = Field(default=0.25, ge=SHORTEST_TIMER_S)
    """How often the queued batches are read from MongoDB (status, cancellation, new batches); the
    pause between rounds when no lines wait (a batch made dispatchable here wakes the loop at once)."""
    start_lines: int = Field(default=32, ge=0)
    """Head start: lines a batch that has not started yet gets ahead of the order in its first
    round; one project's new batches share this many per round (charged to its fair share)."""
    quantum_lines: int = 16
    """Lines one project takes per fair-share turn."""
    deadline_margin_s: float = Field(default=3600.0, ge=0)
    """A batch is at risk, and goes ahead of the fair share in its tier (earliest deadline first),
    when at its rate its remaining lines would not be done this many seconds before its
    ``expires_at``; otherwise its deadline orders nothing."""
    project_weights: str = ""
    """``project=weight,...`` for the fair share between projects."""
    default_project_weight: float = 1.0
    """Weight of a project not named in ``project_weights``."""
    project_tiers: str = ""
    """``project=tier,...`` (integers): a higher tier's projects are served before a lower tier's;
    a project not named is in tier 0. Only the operator grants tiers (a batch's ``priority``
    orders its own project's batches only)."""
    direct_weight: float = 1.0
    """Weight of direct-Kafka requests (pipelines) against batch lines (weight 1) in the topic."""
    worker_window: int = 128
    """In-flight lines counted per consumer-group member in the topic backlog target."""
    backlog_seconds: float = 0.25
    """The backlog target also holds what the group finishes in this many seconds (lines waiting
    for a worker: a batch created now waits about this long behind the others' lines)."""
    min_backlog: int = 64
    """Smallest topic backlog target, in lines."""
    max_backlog: int = 20_000
    """Largest topic backlog target, in lines."""
    commit_lag_s: float = round(3 * WORKER_COMMIT_INTERVAL_S, 3)
    """How long a finished line stays in the measured backlog: the workers commit every
    ``WORKER_COMMIT_INTERVAL_S`` (0.1 s), a worker waiting for lines polls as long, and a fast
    engine's group is read as often (``meter_seconds``; a slow engine's is read less often, but
    its lines take far longer)."""
    meter_seconds: float = Field(default=0.1, ge=SHORTEST_TIMER_S)
    """Shortest pause between readings of the consumer group's committed offsets. While lines wait
    to be sent, they are read once about an eighth of the topic's backlog has drained at the
    measured rate (at most ``journey_check_seconds`` apart; a round follows each reading); with
    nothing to send, every ``journey_check_seconds``."""
    lease_ttl_s: float = 5.0
    """One active dispatcher per model: a lease in MongoDB that lapses this long after its last
    renewal (the takeover time after a crash)."""
    lease_renew_s: float = Field(default=1.0, ge=SHORTEST_TIMER_S)
    """How often the lease holder renews it."""
    position_flush_s: float = Field(default=1.0, ge=SHORTEST_TIMER_S)
    """A batch's read position reaches MongoDB at most this often (and when it is done)."""
    grace_s: float = 15.0
    """A line consumed and committed past with no result this long (and its batch's count standing
    still as long) is sent again."""
    max_attempts: int = 3
    """Sends of one line in all; then it gets a ``line_lost`` error line."""
    takeover_grace_s: float = 30.0
    """After a takeover, lines an earlier dispatcher sent that still lack a result after this are
    sent again (their offsets died with it)."""
    journey_check_seconds: float = Field(default=1.0, ge=SHORTEST_TIMER_S)
    """How often sent lines are checked for results; also the longest pause between readings of
    the group's offsets (the only readings while a model has nothing to send). On a broker that
    keeps no commit metadata the check is how the meter learns of lines done past a stalled
    commit: the local stack on Tansu sets 0.25."""

    @field_validator("project_weights", "project_tiers")
    @classmethod
    def _parses(cls, value: str, info: ValidationInfo) -> str:
        """Each per-project setting parses when the settings load."""
        (parse_weights if info.field_name == "project_weights" else parse_tiers)(value)
        return value

    def weights(self) -> dict[str, float]:
        return parse_weights(self.project_weights)

    def tiers(self) -> dict[str, int]:
        return parse_tiers(self.project_tiers)


def parse_project_values(text: str, parse: Callable[[str], T], what: str, form: str) -> dict[str, T]:
    """``"a=2,b=-1"`` -> ``{"a": parse("2"), "b": parse("-1")}``, blank items skipped: the
    operator's per-project ``what`` (weights, tiers). An item without a name or whose value
    ``parse`` refuses (``ValueError``) is refused, saying to write ``project=<form>``."""
    values: dict[str, T] = {}
    for item in text.split(","):
        if not item.strip():
            continue
        name, sep, raw = item.partition("=")
        try:
            value = parse(raw) if sep and name.strip() else None
        except ValueError:
            value = None
        if value is None:
            raise ValueError(f"bad project {what} {item!r}: write project={form}")
        values[name.strip()] = value
    return values


def _positive(raw: str) -> float:
    value = float(raw)
    if value <= 0:
        raise ValueError(value)
    return value


def parse_weights(text: str) -> dict[str, float]:
    """``"a=2,b=0.5"`` -> ``{"a": 2.0, "b": 0.5}``; a weight must be positive."""
    return parse_project_values(text, _positive, "weight", "positive number")


def parse_tiers(text: str) -> dict[str, int]:
    """``"ops=1,batch=-1"`` -> ``{"ops": 1, "batch": -1}``; a tier is an integer."""
    return parse_project_values(text, int, "tier", "integer")
