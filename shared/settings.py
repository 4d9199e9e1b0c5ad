"""Typed, frozen settings, one class per dependency, all read from the environment.

Every variable is prefixed ``BATCHSTREAM_``; e.g. ``BATCHSTREAM_KAFKA_BOOTSTRAP_SERVERS``. Each
field's docstring is its description in docs/configuration.md, which ``python -m
deploy.config_docs`` generates from these classes (a unit test fails when the page is stale).
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import Annotated, Any, Literal

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
DEV_KAFKA_SIGNING_KEY = "batchstream-local-kafka-signing-key"


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


MIN_SECRET_CHARS = 20
"""Shortest API key or S3 secret a service accepts outside development (the keys
``batchstream keys create`` makes have 49 characters)."""
PLACEHOLDER_WORDS = ("replace", "change", "example", "placeholder", "secret", "password", "default", "test")
"""A secret made of one of these words (any case, with digits or punctuation around it) is a
placeholder someone forgot to replace, e.g. the Kubernetes manifests' ``replace-me``."""


def weak_secret(secret: str) -> str | None:
    """Why ``secret`` must not guard a shared deployment (None when it may): the well-known local
    secrets, a placeholder, or fewer than ``MIN_SECRET_CHARS`` characters. Never echoes it."""
    text = secret.strip()
    if text in (DEV_API_KEY, DEV_S3_SECRET, DEV_KAFKA_SIGNING_KEY):
        return "is the local stack's well-known secret"
    letters = re.sub(r"[^a-z]", "", text.lower())
    if not letters or any(letters == word or letters == word + "me" for word in PLACEHOLDER_WORDS):
        return "is a placeholder"
    if len(text) < MIN_SECRET_CHARS:
        return f"is shorter than {MIN_SECRET_CHARS} characters"
    return None


class RuntimeSettings(BaseSettings):
    """Where the process runs: ``development`` allows the well-known local secrets."""

    model_config = _config("")
    environment: str = "development"
    """``development`` or ``test`` accept any API key, S3 secret and Kafka signing key; any other
    value (e.g. ``production``) makes every service refuse to start while one configured API key,
    the S3 secret or the Kafka signing key is the local stack's, a placeholder (``replace-me``) or
    shorter than 20 characters."""
    log_level: str = "INFO"
    """Python log level; logs are JSON lines on stderr."""

    @property
    def is_development(self) -> bool:
        return self.environment in {"development", "test"}

    @model_validator(mode="after")
    def _no_weak_secrets_outside_development(self) -> RuntimeSettings:
        """Every service reads these settings first, so none starts with a weak secret outside
        development. Each configured key is checked alone (``key`` or ``key=project``)."""
        if self.is_development:
            return self
        problems = [
            f"API key #{i} of BATCHSTREAM_API_KEYS {why}"
            for i, key in enumerate(ApiSettings().project_by_key(), start=1)
            if (why := weak_secret(key)) is not None
        ]
        if not ApiSettings().project_by_key():
            problems.append("BATCHSTREAM_API_KEYS holds no key")
        if (why := weak_secret(StorageSettings().secret_key)) is not None:
            problems.append(f"BATCHSTREAM_S3_SECRET_KEY {why}")
        kafka = KafkaSettings()
        if (why := weak_secret(kafka.signing_key)) is not None:
            problems.append(f"BATCHSTREAM_KAFKA_SIGNING_KEY (the api and workers share it) {why}")
        if kafka.security_protocol.startswith("SASL") and (why := weak_secret(kafka.sasl_password)):
            problems.append(f"BATCHSTREAM_KAFKA_SASL_PASSWORD {why}")
        if problems:
            raise ValueError(
                f"outside development (BATCHSTREAM_ENVIRONMENT={self.environment}) every secret must "
                f"be real: {'; '.join(problems)}"
            )
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
    """Partitions of the ``results``, ``control`` and ``dead-letters`` topics and of the
    aggregator's table when created: the most aggregator workers that share the work."""
    replication_factor: int = 1
    """Replication factor of the topics a service creates."""
    security_protocol: Literal["PLAINTEXT", "SASL_PLAINTEXT", "SASL_SSL", "SSL"] = "PLAINTEXT"
    """How every client of this service reaches the brokers: ``SASL_SSL`` (a user and password over
    TLS) on a shared cluster with ACLs (docs/deployment.md, "Kafka access"); ``PLAINTEXT`` for the
    local stack."""
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = "SCRAM-SHA-512"
    """SASL mechanism, with a ``SASL_*`` protocol."""
    sasl_username: str = ""
    """This service's Kafka user (its ACLs say what it may read and write)."""
    sasl_password: str = Field(default="", repr=False)
    """That user's password."""
    ssl_cafile: str = ""
    """CA bundle that signed the brokers' certificates (``SSL`` / ``SASL_SSL``); empty: the system's."""
    signing_key: str = Field(default=DEV_KAFKA_SIGNING_KEY, min_length=MIN_SECRET_CHARS, repr=False)
    """Key of the HMAC-SHA256 with which the api signs each batch line's request message and the
    workers check it (docs/kafka-protocol.md#signed-batch-lines); the api and every worker must
    share it. The default (the local stack's) is refused outside development."""
    reply_topic_pattern: str = r"^[A-Za-z0-9._-]+$"
    """Regular expression a request's ``reply_topic`` must match (searched), besides being a legal
    Kafka topic name that no service owns; e.g. ``^replies\\.`` lets pipelines answer only to
    topics named ``replies.*``. A request with another reply topic is not run: it goes to the
    dead-letter topic."""
    max_request_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    """Largest message a producer sends (aiokafka's ``max_request_size``; 8 MiB), and the
    ``max.message.bytes`` of the requests and results topics a service creates. At most the
    brokers' ``message.max.bytes`` (8 MiB in docker-compose.yml), and above
    ``BATCHSTREAM_API_MAX_LINE_BYTES`` with room for a request's envelope: the dispatcher makes a
    line whose message is larger, or that the broker refuses as too large, that line's
    ``line_undeliverable`` error result."""

    @field_validator("reply_topic_pattern")
    @classmethod
    def _pattern_compiles(cls, pattern: str) -> str:
        try:
            re.compile(pattern)
        except re.error as e:
            raise ValueError(f"reply_topic_pattern is not a regular expression: {e}") from e
        return pattern

    @model_validator(mode="after")
    def _sasl_needs_a_user(self) -> KafkaSettings:
        if self.security_protocol.startswith("SASL") and not (self.sasl_username and self.sasl_password):
            raise ValueError(
                f"BATCHSTREAM_KAFKA_SECURITY_PROTOCOL={self.security_protocol} needs "
                "BATCHSTREAM_KAFKA_SASL_USERNAME and BATCHSTREAM_KAFKA_SASL_PASSWORD"
            )
        return self


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
    metrics_host: str = "127.0.0.1"
    """Address of the api's Prometheus ``/metrics`` server (``0.0.0.0`` in a container, so the
    scraper reaches it)."""
    metrics_port: int = Field(default=10901, ge=0)
    """Port of that server, apart from the api's own: its series name projects and their queues,
    so it is reachable by the scraper, not by the api's users (0: no metrics server)."""
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
    max_message_batch_bytes: int = Field(default=256 * 1024 * 1024, ge=1)
    """Largest ``POST /v1/messages/batches`` body (256 MiB, Anthropic's limit): the api holds a
    message batch's requests in memory while it checks them and writes its input file; a larger
    body answers 413 ``request_too_large``."""
    max_message_batch_creates: int = Field(default=1, ge=1)
    """Message batch creates the api reads and checks at once, whichever projects send them: each
    holds its requests in memory, several times its body's size; one more answers 429
    ``too_many_creates`` with ``retry-after`` (the SDKs retry it)."""
    max_batch_lines: int = 1_000_000
    """Most request lines in a batch input file (OpenAI's is 50,000); more fail the batch with
    ``too_many_tasks`` naming the limit."""
    max_reported_errors: int = 1000
    """Most entries in a failed batch's ``errors.data`` (the log gives the full count of bad lines)."""
    max_reported_error_bytes: int = Field(default=64 * 1024, ge=4096)
    """Most bytes (as JSON) of a failed batch's ``errors.data``, so a batch object stays small
    whatever its lines echo. When errors are left out (by this or ``max_reported_errors``), the
    last entry, code ``errors_truncated``, says how many there were in all."""
    max_list_bytes: int = Field(default=1024 * 1024, ge=1)
    """Most bytes (as JSON) of the items on one page of ``GET /v1/batches``, ``GET /v1/files`` and
    a batch's ``error_lines``: a page ends before the item that would pass it (it always holds
    one) and says ``has_more``, so paging with ``after`` (or ``next_offset``) still reaches every
    item."""
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
            key, _, project = item.partition("=")
            if key.strip():
                projects[key.strip()] = project.strip() or "default"
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


class MediaSettings(BaseSettings):
    """Media URLs in request lines (images, audio, video): what the workers may fetch."""

    model_config = _config("MEDIA_")
    allowed_domains: str = ""
    """Comma-separated host names whose ``http(s)`` media URLs the engine may fetch (exact names,
    e.g. ``images.example.com``); ``data:`` URLs are always taken. Empty: ``data:`` URLs only. A
    line naming another URL is refused at validation (and by the worker, for direct-Kafka
    requests); vLLM gets the same list and fetches without following redirects."""

    @property
    def domains(self) -> frozenset[str]:
        return frozenset(d.strip().lower() for d in self.allowed_domains.split(",") if d.strip())


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
    allow_private_targets: bool = False
    """Send events to loopback, link-local, private and other non-public addresses too (checked on
    every address a name resolves to, on the connection made). Off, such an event is given up at
    once: a project's endpoint cannot reach the cluster's internal hosts or cloud metadata.
    Redirects are never followed either way."""
    missed_end_after_s: float = Field(default=30.0, gt=0)
    """A batch that ended this long ago and whose event was never recorded (the process that
    ended it was killed between the two writes) gets its event recorded by the aggregator."""
