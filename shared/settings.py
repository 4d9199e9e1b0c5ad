"""Typed, frozen settings, one class per dependency, all read from the environment.

Every variable is prefixed ``BATCHSTREAM_``; e.g. ``BATCHSTREAM_KAFKA_BOOTSTRAP_SERVERS``. Each
field's docstring is its description in docs/configuration.md, which ``python -m
deploy.config_docs`` generates from these classes (a unit test fails when the page is stale).
"""

from __future__ import annotations

import base64
import binascii
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    HttpUrl,
    MongoDsn,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict

DEV_API_KEY = "sk-batchstream-local"
DEV_S3_SECRET = "batchstream-local-secret"


def _config(prefix: str) -> SettingsConfigDict:
    return SettingsConfigDict(
        env_prefix=f"BATCHSTREAM_{prefix}", frozen=True, extra="ignore", use_attribute_docstrings=True
    )


def _url_text(url_type: Any, refusal: str) -> AfterValidator:
    """A ``str`` field checked as the pydantic URL type and kept as written: its readers (the
    driver, the HTTP client) take the text, and the parsed URL would rewrite it (a trailing ``/``
    after a bare host). ``refusal`` is the error, followed by the value."""
    adapter: TypeAdapter[Any] = TypeAdapter(url_type)

    def check(text: str) -> str:
        try:
            adapter.validate_python(text)
        except ValidationError as e:
            raise ValueError(f"{refusal}; got {text!r}") from e
        return text

    return AfterValidator(check)


MongoUrl = Annotated[str, _url_text(MongoDsn, "a MongoDB uri must be mongodb[+srv]://host[:port]/...")]
WebhookUrl = Annotated[str, _url_text(HttpUrl, "a webhook url must be http(s)://host/...")]


class RuntimeSettings(BaseSettings):
    """Where the process runs: ``development`` allows the well-known local secrets."""

    model_config = _config("")
    environment: str = "development"
    """``development`` or ``test`` accept the well-known local API key and S3 secret; any other
    value (e.g. ``production``) makes every service refuse to start with them."""
    log_level: str = "INFO"
    """Python log level; logs are JSON lines on stderr."""

    @property
    def is_development(self) -> bool:
        return self.environment in {"development", "test"}

    @model_validator(mode="after")
    def _no_local_secrets_outside_development(self) -> RuntimeSettings:
        """Every service reads these settings first, so none starts with the well-known local
        secrets outside development."""
        if self.is_development:
            return self
        if ApiSettings().keys == DEV_API_KEY or StorageSettings().secret_key == DEV_S3_SECRET:
            raise ValueError("set BATCHSTREAM_API_KEYS and BATCHSTREAM_S3_SECRET_KEY outside development")
        return self


class KafkaSettings(BaseSettings):
    """The Kafka cluster and the topics every service agrees on."""

    model_config = _config("KAFKA_")
    bootstrap_servers: str = "127.0.0.1:19092"
    """Comma-separated ``host:port`` list of brokers."""
    topic_prefix: str = ""
    """Prefix of every topic name (and of the aggregator's group and changelog), so several
    deployments can share one cluster."""
    request_partitions: int = 4
    """Partitions of a ``requests.<model>`` topic when a service creates it: the most workers one
    model can use at once."""
    results_partitions: int = 4
    """Partitions of the ``results`` and ``control`` topics and of the aggregator's table when
    created: the most aggregator workers that share the work."""
    replication_factor: int = 1
    """Replication factor of the topics a service creates."""
    max_request_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    """Largest message a producer sends (aiokafka's ``max_request_size``; 8 MiB), and the
    ``max.message.bytes`` of the requests and results topics a service creates. At most the
    brokers' ``message.max.bytes`` (8 MiB in docker-compose.yml), and above
    ``BATCHSTREAM_API_MAX_LINE_BYTES`` with room for a request's envelope: the dispatcher makes a
    line whose message is larger, or that the broker refuses as too large, that line's
    ``line_undeliverable`` error result."""


class MongoSettings(BaseSettings):
    """MongoDB: file, batch, model, API key and idempotency documents."""

    model_config = _config("MONGO_")
    uri: MongoUrl = "mongodb://127.0.0.1:27117/?directConnection=true"
    """MongoDB connection string."""
    database: str = "batchstream"
    """Database that holds batchstream's collections."""
    journal: bool = True
    """Acknowledge a write only once it is in the journal (write concern ``j: true``), so a MongoDB
    killed right after acknowledging it keeps it. Measured on the local stack's server: with
    ``false``, a SIGKILL lost every write since its last checkpoint (200 of 200 upserts), which
    once left a batch ``in_progress`` that the aggregator had already completed; with ``true`` it
    lost none, at no measurable cost there. A replica set's ``w: majority`` writes are journaled
    anyway."""


class StorageSettings(BaseSettings):
    """Object storage (S3, MinIO, SeaweedFS): file bytes and result chunks."""

    model_config = _config("S3_")
    endpoint: str = "127.0.0.1:18333"
    """``host:port`` of the S3 endpoint, without scheme."""
    access_key: str = "batchstream"
    """S3 access key."""
    secret_key: str = DEV_S3_SECRET
    """S3 secret key; the default (the local stack's) is refused outside development."""
    bucket: str = "batchstream"
    """Bucket for file bytes and result chunks; created when missing."""
    secure: bool = False
    """Use HTTPS to reach the endpoint."""
    region: str = "us-east-1"
    """S3 region."""


class ApiSettings(BaseSettings):
    """The HTTP api: where it listens, who may call it, OpenAI's limits."""

    model_config = _config("API_")
    host: str = "127.0.0.1"
    """Address the api listens on."""
    port: int = 10900
    """Port the api listens on."""
    keys: str = DEV_API_KEY
    """Comma-separated API keys, each ``key`` or ``key=project`` (a bare key belongs to project
    ``default``); hashed at start-up. The default is refused outside development."""
    max_file_bytes: int = 512 * 1024 * 1024
    """Largest upload in bytes (OpenAI's 512 MiB); larger ones answer 413."""
    max_batch_input_bytes: int = 2 * 1024**3
    """Largest ``purpose=batch`` upload in bytes (2 GiB; OpenAI's is 200 MB); larger ones answer
    413 naming the limit."""
    max_line_bytes: int = Field(default=4 * 1024 * 1024, ge=1)
    """Largest line of a batch input file in bytes, without its newline (4 MiB): a longer line
    fails its batch with ``line_too_large`` naming its size and the limit, and is never held in
    memory. Each line travels as one Kafka message (the line and an envelope of about a
    kilobyte), so keep it below ``BATCHSTREAM_KAFKA_MAX_REQUEST_BYTES`` and the broker's
    ``message.max.bytes`` (docs/deployment.md)."""
    max_json_body_bytes: int = Field(default=1024 * 1024, ge=1)
    """Largest request body of any call but a file upload (1 MiB): a longer one answers 413
    ``request_too_large`` as soon as its ``Content-Length`` or its bytes so far say so."""
    max_batch_lines: int = 1_000_000
    """Most request lines in a batch input file (OpenAI's is 50,000); more fail the batch with
    ``too_many_tasks`` naming the limit."""
    max_reported_errors: int = 1000
    """Most entries in a failed batch's ``errors.data`` (the log gives the full count of bad lines)."""
    create_dedupe_window_s: float = 60.0
    """Identical creates (same project, same body) without an ``Idempotency-Key`` within this many
    seconds return the first batch."""
    process_attempts: int = Field(default=3, ge=1)
    """Tries to validate and emit one batch per start (backoff from ``process_retry_wait_s``)."""
    process_retry_wait_s: float = Field(default=1.0, ge=0)
    """First wait between those tries, in seconds (exponential, with jitter)."""
    process_max_starts: int = Field(default=5, ge=1)
    """Starts (api restarts included) before a batch that never gets through ends ``failed``."""
    input_copy_bytes: int = Field(default=2 * 1024**3, ge=0)
    """Bytes of uploaded files the api keeps on its local disk, so that validating and dispatching
    a batch read its input there instead of from object storage (least recently used go first;
    0: none)."""
    input_copy_dir: str = ""
    """Directory for those copies: they live in its ``batchstream-input-copies`` subdirectory,
    emptied at start and stop (one per api process); empty: a new temporary directory."""

    def project_by_key(self) -> dict[str, str]:
        """Map each configured key to its project (``default`` unless named)."""
        projects: dict[str, str] = {}
        for item in self.keys.split(","):
            key, _, project = item.strip().partition("=")
            if key:
                projects[key] = project or "default"
        return projects


# How often an inference worker commits its finished lines by default (``commit_interval_s`` of
# services/inference/settings.py; kept here because the api reads it too).
# The api's dispatcher meters the requests topic by the group's commits and counts a line as
# queued until it is committed: its ``commit_lag_s`` follows from this. At 0.5 s a line of the
# instant engine counted ~1.2 s and the topic was refilled in steps; a commit is one small request.
WORKER_COMMIT_INTERVAL_S = 0.1


class AggregatorSettings(BaseSettings):
    """The aggregator's settings other processes read too (more in services/aggregator/settings.py)."""

    model_config = _config("AGGREGATOR_")
    app_id: str = "batchstream-aggregator"
    """faust app id: the consumer group and the table's changelog topic are named after it (with
    the topic prefix)."""
    data_dir: str = "/tmp/batchstream-aggregator"
    """faust's local state and the finalizer's scratch files."""
    web_port: int = 10910
    """Port of the aggregator's ``/health`` and ``/metrics``."""
    chunk_lines: int = 10_000
    """Most results in one chunk object."""
    chunk_seconds: float = 0.25
    """Most seconds a result waits for its chunk to be cut (a chunk holding a batch's last
    results is cut at once). Live counts follow each chunk: at 0.5 the 50,000-line benchmark's
    count lag was 0.8-0.9 s at p50, at 0.25 it is 0.55-0.6 s for the same CPU; 0.15 gained
    nothing more and cost CPU."""
    counts_flush_seconds: float = 0.5
    """How often live ``request_counts`` and ``usage`` still unwritten reach MongoDB (they are
    also written right after each chunk)."""
    sweep_seconds: float = 5.0
    """How often the aggregator looks for batches to end: complete, expired, or cancelling past
    the cancel timeout."""


WEBHOOK_SECRET_PREFIX = "whsec_"


class WebhookEndpoint(BaseModel):
    """Where one project's batch events go, and the secret that signs them (docs/webhooks.md)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    url: WebhookUrl
    secret: str = Field(repr=False)

    @field_validator("secret")
    @classmethod
    def _whsec_secret(cls, secret: str) -> str:
        if not secret.startswith(WEBHOOK_SECRET_PREFIX):
            raise ValueError("a webhook secret must start with 'whsec_' (then the base64 key)")
        try:
            key = base64.b64decode(secret.removeprefix(WEBHOOK_SECRET_PREFIX), validate=True)
        except binascii.Error as e:
            raise ValueError("a webhook secret must be 'whsec_' followed by base64") from e
        if len(key) < 24:
            raise ValueError("a webhook secret's key must be at least 24 bytes (32 recommended)")
        return secret

    @property
    def key(self) -> bytes:
        """The HMAC key: the base64 after the ``whsec_`` prefix, decoded."""
        return base64.b64decode(self.secret.removeprefix(WEBHOOK_SECRET_PREFIX))


class WebhookSettings(BaseSettings):
    """Batch event webhooks (``batch.completed``, ``.failed``, ``.expired``, ``.cancelled``);
    see docs/webhooks.md."""

    model_config = SettingsConfigDict(**_config("WEBHOOK_"), env_ignore_empty=True)  # compose's empty default
    endpoints: dict[str, WebhookEndpoint] = Field(default_factory=dict)
    """JSON object of project to endpoint, ``{"<project>": {"url": "https://...", "secret":
    "whsec_<base64 key>"}}``. A project without one records no events. A bad url or secret stops
    the api and the aggregator at start-up."""
    max_age_s: float = Field(default=72 * 3600, gt=0)
    """How long an event is retried after it was recorded (OpenAI's 72 hours); then it is marked
    failed (``batchstream_webhook_deliveries_total{outcome="failed"}``)."""
    first_retry_s: float = Field(default=5.0, gt=0)
    """Wait before the second attempt; it doubles each attempt (with jitter) up to
    ``max_retry_s``."""
    max_retry_s: float = Field(default=3600.0, gt=0)
    """Longest wait between two attempts."""
    timeout_s: float = Field(default=10.0, gt=0)
    """How long one attempt waits for the receiver's answer; only a 2xx counts as delivered."""
    poll_seconds: float = Field(default=1.0, gt=0)
    """How often the aggregator looks for events due for an attempt."""
    lease_s: float = Field(default=60.0, gt=0)
    """An aggregator that claimed an event owns that attempt this long (longer than
    ``timeout_s``), so two workers never send the same attempt at once."""
    concurrency: int = Field(default=8, ge=1)
    """Events one aggregator sends at once."""
    missed_end_after_s: float = Field(default=30.0, gt=0)
    """A batch that ended this long ago and whose event was never recorded (the process that
    ended it was killed between the two writes) gets its event recorded by the aggregator."""
