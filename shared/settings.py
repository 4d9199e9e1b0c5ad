"""Typed, frozen settings, one class per dependency, all read from the environment.

Every variable is prefixed ``BATCHSTREAM_``; e.g. ``BATCHSTREAM_KAFKA_BOOTSTRAP_SERVERS``. Each
field's docstring is its description in docs/configuration.md, which ``python -m
deploy.config_docs`` generates from these classes (a unit test fails when the page is stale).
"""

from __future__ import annotations

import base64
import binascii
from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

DEV_API_KEY = "sk-batchstream-local"
DEV_S3_SECRET = "batchstream-local-secret"


def _config(prefix: str) -> SettingsConfigDict:
    return SettingsConfigDict(
        env_prefix=f"BATCHSTREAM_{prefix}", frozen=True, extra="ignore", use_attribute_docstrings=True
    )


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

    def check_secrets(self) -> None:
        """Refuse to run with the well-known local secrets outside development."""
        if self.is_development:
            return
        if ApiSettings().keys == DEV_API_KEY or StorageSettings().secret_key == DEV_S3_SECRET:
            raise ValueError("set BATCHSTREAM_API_KEYS and BATCHSTREAM_S3_SECRET_KEY outside development")


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


class MongoSettings(BaseSettings):
    """MongoDB: file, batch, model, API key and idempotency documents."""

    model_config = _config("MONGO_")
    uri: str = "mongodb://127.0.0.1:27117/?directConnection=true"
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
    max_batch_input_bytes: int = 200 * 1024 * 1024
    """Largest ``purpose=batch`` upload in bytes (OpenAI's 200 MiB)."""
    max_batch_lines: int = 50_000
    """Most request lines in a batch input file; more fail the batch with ``too_many_tasks``."""
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


# How often an inference worker commits its finished lines by default (``commit_interval_s``).
# The api's dispatcher meters the requests topic by the group's commits and counts a line as
# queued until it is committed: its ``commit_lag_s`` follows from this. At 0.5 s a line of the
# instant engine counted ~1.2 s and the topic was refilled in steps; a commit is one small request.
WORKER_COMMIT_INTERVAL_S = 0.1

# The worker's default window: lines it holds per engine place (see ``max_in_flight``).
IN_FLIGHT_PER_PLACE = 16


class InferenceSettings(BaseSettings):
    """One worker serves one model on one engine (one GPU, or the CPU here)."""

    model_config = _config("INFERENCE_")
    engine: str = "vllm"
    """``vllm``, or ``fake``: instant answers without a model, for tests and the pipeline
    benchmark."""
    fake_seconds_per_token: float = Field(default=0.0, ge=0)
    """The ``fake`` engine's pace: each request takes this many seconds per ``max_tokens`` (1
    when the body has none); 0: instant. Tests use it to keep a batch running for a while."""
    model: str = Field(default="", description="Path or name of the model vLLM loads.")
    served_model_name: str = ""
    """The model id clients name in ``body.model``; names the topic ``requests.<id>``. Default:
    the model."""
    runner: str = "generate"
    """vLLM runner: ``generate`` (chat, completions) or ``pooling`` (an embeddings model)."""
    dtype: str = "auto"
    """vLLM ``--dtype``."""
    max_num_seqs: int = 64
    """vLLM ``--max-num-seqs``: sequences the engine batches at once."""
    max_model_len: int = 2048
    """vLLM ``--max-model-len`` (prompt + output tokens); 0: the model's own limit."""
    tensor_parallel_size: int = 1
    """vLLM ``--tensor-parallel-size``: GPUs one engine spans."""
    gpu_memory_utilization: float = 0.9
    """vLLM ``--gpu-memory-utilization``."""
    enforce_eager: bool = False
    """vLLM ``--enforce-eager`` (no CUDA graphs; faster start)."""
    engine_stats: bool = True
    """vLLM's own statistics: its ``vllm:*`` Prometheus series on the worker's ``/metrics``
    (among them ``vllm:prefix_cache_queries``/``vllm:prefix_cache_hits``, the prefix-cache hit
    rate, and ``vllm:prompt_tokens``/``vllm:prompt_tokens_cached``: prefill tokens computed is
    their difference), and its periodic log line. Off: ``--disable-log-stats``."""
    kv_cache_blocks: int = Field(default=0, ge=0)
    """vLLM ``--num-gpu-blocks-override``: the KV cache's size in blocks (the CPU backend honours
    it too); 0: what the memory settings give. The benchmarks size both sides' caches alike."""
    prompt_tokens_details: bool = True
    """vLLM ``--enable-prompt-tokens-details``: chat and completions bodies report
    ``usage.prompt_tokens_details.cached_tokens`` (prompt tokens served from the prefix cache),
    which the batch's ``usage.input_tokens_details.cached_tokens`` sums. Responses bodies always
    report it."""
    max_in_flight: int = 0
    """Requests the worker holds at once (running on the engine or waiting for a place on it);
    it takes no more while full. Results waiting for the broker's acknowledgement do not count
    (see ``max_publishing``). 0: sixteen times ``max_num_seqs``: the lines beyond the engine's
    places wait in the worker, where a new batch's lines go first, rather than in the topic in
    arrival order. With four times, the dispatcher's backlog outgrew the window at a big batch's
    start, and a small batch's lines waited in the topic for the engine's first wave to end; a
    waiting line costs only its message's memory (a few kB)."""
    scheduling_policy: Literal["priority", "fcfs"] = "priority"
    """vLLM's queue order for the lines waiting inside it (a young batch's lines let in over
    its places, and ``engine_queue_lines``). ``priority``: the worker's order (a line of the batch
    with the fewest lines in the worker first); ``fcfs``: arrival order."""
    engine_queue_lines: int = Field(default=-1, ge=-1)
    """Lines let onto the engine beyond the ``max_num_seqs`` it runs: they wait inside vLLM,
    tokenized, and start the moment a sequence ends. -1: as many as ``max_num_seqs``, so when a
    whole wave of sequences ends at once (lines of equal length) the next wave starts at the next
    engine step, not one line at a time as the worker hands each to vLLM (docs/benchmarks.md,
    23c44da, 2026-12-02). 0: every waiting line waits in the worker. The lines that make way for a young
    batch's line are the newest on the engine, mostly these (``young_batch_lines``); with a share
    of 1 and ``fcfs`` a young line waits behind them. On a shutdown they are drained with the
    running ones (``drain_timeout_s``): up to one more wave."""
    young_batch_lines: int = Field(default=16, ge=0)
    """A batch's first lines in the worker, while it has fewer than this there, are young: each
    goes onto the engine at once, and the newest lines on the engine of the batch with the most
    there are aborted to make room, mostly those waiting inside it (they wait for a place again; a
    running line's work so far is lost).
    So a new batch starts at once rather than after running sequences end. 0: no line is young.
    Direct requests are never young."""
    young_batch_others_share: float = Field(default=0.25, ge=0, le=1)
    """While young lines run, the batches without one keep at most this share of the engine's
    ``max_num_seqs`` places (the rest are aborted, and run again once the young lines are done).
    On a CPU an engine step costs about in proportion to the sequences in it: a new batch's lines
    beside 54 others take 2.5 times as long as alone, beside 16 about 1.5 times. 1: no limit (a
    GPU's step time grows far less with the sequences in it; measure before you choose)."""
    max_publishing: int = Field(default=4096, ge=1)
    """Results waiting for the broker's acknowledgement at once; while as many wait the worker
    takes no new request. A fast engine finishes lines far quicker than one acknowledgement
    returns (128 waiting capped the instant engine at ~3,000 lines/s), and each waits with its
    result in memory (a few kB)."""
    health_port: int = 0
    """Port of the worker's ``/health`` and ``/metrics``; 0: no health server."""
    health_host: str = "127.0.0.1"
    """Address of the health server (``0.0.0.0`` in a container)."""
    drain_timeout_s: float = 30.0
    """On SIGTERM, how long in-flight requests may finish before they are aborted (and redone by
    the next owner)."""
    fetch_max_wait_ms: int = 100
    """How long an idle fetch may wait for requests. Tansu holds a fetch this long even when
    records arrive meanwhile (aiokafka's default, 500, delays a new batch's first lines)."""
    commit_interval_s: float = Field(default=WORKER_COMMIT_INTERVAL_S, gt=0)
    """How often the worker commits the offsets of finished lines. The api's dispatcher counts a
    line as queued until it is committed, so a longer interval keeps the topic emptier than the
    workers need (docs/dispatcher.md); each commit is one small request."""
    group_instance_id: str = ""
    """Static group membership (Kafka's ``group.instance.id``): a name that stays the same across
    restarts of one worker and differs between the workers of a model (e.g. a StatefulSet pod
    name). On Kafka a worker restarted within ``session_timeout_s`` takes the killed member's place
    and partitions at once, without a rebalance, instead of waiting for it to be dropped first
    (the local stack leaves it empty: on Tansu it measured slower with two workers).
    Trade-off: a static member does not leave the group when it stops, so the partitions of a
    worker stopped for good (or rolled) move to the others only after ``session_timeout_s``. Two
    running workers must never share a name (the broker fences one out). Empty: dynamic membership."""
    session_timeout_s: float = Field(default=10.0, gt=0)
    """How long the group waits without a heartbeat before a worker's partitions go to the others
    (a killed or frozen worker); also bounds how long a rebalance waits for a member. aiokafka's
    default; the local stack sets 6 (Kafka's lowest by default, ``group.min.session.timeout.ms``;
    Tansu holds a dynamic member's JoinGroup for half of it)."""
    heartbeat_interval_s: float = Field(default=3.0, gt=0)
    """How often a worker heartbeats, which is also how soon a live worker learns of a rebalance
    (one worker gone, another joining); below a third of ``session_timeout_s``. The local stack
    sets 1."""
    engine_attempts: int = Field(default=3, ge=1)
    """Tries per line when the engine fails in a way that may pass (a 5xx answer: overloaded,
    restarting, internal error; or an exception); 1: never again. A 4xx is never retried."""
    engine_retry_wait_s: float = Field(default=0.2, ge=0)
    """First wait between engine tries; it doubles (random exponential backoff, with jitter)."""
    engine_retry_max_wait_s: float = Field(default=2.0, ge=0)
    """Longest wait between engine tries."""
    publish_attempts: int = Field(default=5, ge=1)
    """Tries per result publish the broker refuses or does not confirm; after the last, the
    worker exits (status 1) without committing the line, and the next owner runs it again."""
    publish_retry_max_wait_s: float = Field(default=5.0, ge=0)
    """Longest wait between publish tries (random exponential backoff from 0.2 s, with jitter)."""

    @model_validator(mode="after")
    def _heartbeat_within_session(self) -> InferenceSettings:
        if self.heartbeat_interval_s >= self.session_timeout_s:
            raise ValueError(
                f"heartbeat_interval_s ({self.heartbeat_interval_s}) must be below "
                f"session_timeout_s ({self.session_timeout_s}); a third of it or less is usual"
            )
        return self

    @property
    def model_id(self) -> str:
        return self.served_model_name or self.model

    @property
    def in_flight_limit(self) -> int:
        return self.max_in_flight or IN_FLIGHT_PER_PLACE * self.max_num_seqs

    @property
    def engine_queue_size(self) -> int:
        """``engine_queue_lines`` resolved: lines waiting inside vLLM beyond its running ones."""
        return self.max_num_seqs if self.engine_queue_lines < 0 else self.engine_queue_lines


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
    url: str
    secret: str = Field(repr=False)

    @field_validator("url")
    @classmethod
    def _http_url(cls, url: str) -> str:
        parts = urlsplit(url)
        if parts.scheme not in {"http", "https"} or not parts.netloc:
            raise ValueError(f"a webhook url must be http(s)://host/...; got {url!r}")
        return url

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
