"""Typed, frozen settings, one class per dependency, all read from the environment.

Every variable is prefixed ``BATCHSTREAM_``; e.g. ``BATCHSTREAM_KAFKA_BOOTSTRAP_SERVERS``.
"""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

DEV_API_KEY = "sk-batchstream-local"
DEV_S3_SECRET = "batchstream-local-secret"


def _config(prefix: str) -> SettingsConfigDict:
    return SettingsConfigDict(env_prefix=f"BATCHSTREAM_{prefix}", frozen=True, extra="ignore")


class RuntimeSettings(BaseSettings):
    """Where the process runs: ``development`` allows the well-known local secrets."""

    model_config = _config("")
    environment: str = "development"
    log_level: str = "INFO"

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
    model_config = _config("KAFKA_")
    bootstrap_servers: str = "127.0.0.1:19092"
    topic_prefix: str = ""
    request_partitions: int = 4
    results_partitions: int = 4
    replication_factor: int = 1


class MongoSettings(BaseSettings):
    model_config = _config("MONGO_")
    uri: str = "mongodb://127.0.0.1:27117/?directConnection=true"
    database: str = "batchstream"


class StorageSettings(BaseSettings):
    model_config = _config("S3_")
    endpoint: str = "127.0.0.1:18333"
    access_key: str = "batchstream"
    secret_key: str = DEV_S3_SECRET
    bucket: str = "batchstream"
    secure: bool = False
    region: str = "us-east-1"


class ApiSettings(BaseSettings):
    model_config = _config("API_")
    host: str = "127.0.0.1"
    port: int = 10900
    # Comma separated; a key may be written "key=project" to name its project.
    keys: str = DEV_API_KEY
    max_file_bytes: int = 512 * 1024 * 1024
    max_batch_input_bytes: int = 200 * 1024 * 1024
    max_batch_lines: int = 50_000
    max_reported_errors: int = 1000
    # Identical creates (same key, same body) within this window return the first batch.
    create_dedupe_window_s: float = 60.0

    def project_by_key(self) -> dict[str, str]:
        """Map each configured key to its project (``default`` unless named)."""
        projects: dict[str, str] = {}
        for item in self.keys.split(","):
            key, _, project = item.strip().partition("=")
            if key:
                projects[key] = project or "default"
        return projects


class InferenceSettings(BaseSettings):
    """One worker serves one model on one engine (one GPU, or the CPU here)."""

    model_config = _config("INFERENCE_")
    engine: str = "vllm"  # or "fake": InstantFakeEngine, for tests and the pipeline benchmark
    model: str = Field(default="", description="Path or name of the model vLLM loads.")
    served_model_name: str = ""
    runner: str = "generate"  # or "pooling" for an embeddings model
    dtype: str = "auto"
    max_num_seqs: int = 64
    max_model_len: int = 2048
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = 0.9
    enforce_eager: bool = False
    max_in_flight: int = 0  # 0: twice max_num_seqs
    health_port: int = 0  # 0: no health server
    health_host: str = "127.0.0.1"  # 0.0.0.0 in a container
    drain_timeout_s: float = 30.0  # on SIGTERM: how long in-flight requests may finish
    # How long an idle fetch may wait for requests. Tansu holds a fetch this long even when
    # records arrive meanwhile (aiokafka's default, 500, delays a new batch's first lines).
    fetch_max_wait_ms: int = 100
    group_id: str = ""  # default: batchstream-inference-<model>
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

    @property
    def model_id(self) -> str:
        return self.served_model_name or self.model

    @property
    def in_flight_limit(self) -> int:
        return self.max_in_flight or 2 * self.max_num_seqs


class AggregatorSettings(BaseSettings):
    model_config = _config("AGGREGATOR_")
    app_id: str = "batchstream-aggregator"
    data_dir: str = "/tmp/batchstream-aggregator"
    web_port: int = 10910
    chunk_lines: int = 10_000
    chunk_seconds: float = 0.5
    counts_flush_seconds: float = 0.5
    sweep_seconds: float = 5.0
