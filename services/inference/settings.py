"""The inference worker's settings (``BATCHSTREAM_INFERENCE_*``); only the worker reads them.

Each field's docstring is its description in docs/configuration.md (``python -m
deploy.config_docs``).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from shared.settings import WORKER_COMMIT_INTERVAL_S

# The engines ``engines.open_engine`` builds.
EngineName = Literal["vllm", "remote", "fake", "sim"]

# The worker's default window: lines it holds per engine place (see ``max_in_flight``).
IN_FLIGHT_PER_PLACE = 16


class InferenceSettings(BaseSettings):
    """One worker serves one model on one engine (one GPU, or the CPU here)."""

    model_config = SettingsConfigDict(
        env_prefix="BATCHSTREAM_INFERENCE_", frozen=True, extra="ignore", use_attribute_docstrings=True
    )
    engine: EngineName = "vllm"
    """``vllm`` (the model in this process), ``remote`` (each line sent to an OpenAI-compatible
    server at ``remote_url``; no model here), or ``fake``: instant answers without a model, for
    tests and the pipeline benchmark; or ``sim``: a simulated GPU (``sim_engine.py``: continuous
    batching, a KV cache, step times of a published vLLM curve) for the benchmarks' comparisons
    of orders and policies, never a claim about hardware."""
    sim_speedup: float = Field(default=1.0, gt=0)
    """The ``sim`` engine's clock: simulated seconds per wall-clock second (10: a simulated hour
    in six minutes). Every time it reports is simulated time divided by this."""
    fake_seconds_per_token: float = Field(default=0.0, ge=0)
    """The ``fake`` engine's pace: each request takes this many seconds per ``max_tokens`` (1
    when the body has none); 0: instant. Tests use it to keep a batch running for a while."""
    fake_max_running: int = Field(default=0, ge=0)
    """The ``fake`` engine's places, as vLLM's ``max_num_seqs``: the worker puts at most this many
    lines on it (plus ``engine_queue_lines``) and keeps the others waiting for a place, where it
    shares them by project and batch; 0: no limit (every line the worker holds runs at once). With
    a pace, a fixed capacity, as a GPU's: the tenants benchmark uses it."""
    model: str = Field(default="", description="Path or name of the model vLLM loads.")
    remote_url: str = ""
    """The ``remote`` engine's server: its root or OpenAI base URL (``http://vllm:8000`` or
    ``http://vllm:8000/v1``)."""
    remote_api_key: str = ""
    """The ``remote`` engine's key for its server (sent as ``Authorization: Bearer``); empty:
    none."""
    remote_model: str = ""
    """The model's name on the server (the body's ``model`` sent to it); default: ``model_id``.
    Answers are passed on as the server gives them, model name included."""
    remote_timeout_s: float = Field(default=600.0, gt=0)
    """Longest wait for one byte of a server's answer (a line's whole answer for a server that
    does not stream it); then the line's try fails as a 503 and is retried."""
    remote_connect_timeout_s: float = Field(default=5.0, gt=0)
    """Longest wait to connect to the server."""
    remote_start_timeout_s: float = Field(default=300.0, ge=0)
    """How long the worker waits at start for its server to answer ``/v1/models``."""
    remote_admission: bool = True
    """Adapt the lines on the server to its load (``admission.py``): keep its waiting queue near
    empty so live requests do not wait behind batch lines. Off: always ``max_num_seqs`` lines
    on it."""
    remote_load_interval_s: float = Field(default=0.5, gt=0)
    """How often the worker reads the server's queue from its ``/metrics`` (vLLM's
    ``vllm:num_requests_waiting``, SGLang's ``sglang:num_queue_reqs``). A server without either
    is read by latency instead (``remote_latency_tolerance``)."""
    remote_waiting_target: int = Field(default=0, ge=0)
    """Requests (anyone's) that may wait in the server's queue before the worker takes lines
    back: 0 keeps it empty, so a live request starts at the next step."""
    remote_latency_tolerance: float = Field(default=2.0, gt=1)
    """For a server without a queue reading: an answer's seconds per output token this many
    times the best seen lately means the server is saturated, and the worker takes lines back."""
    remote_min_lines: int = Field(default=1, ge=1)
    """Lines the worker keeps on the server however loaded it is (the batch always moves)."""
    remote_priority: int | None = None
    """The ``priority`` sent with every line, plus the worker's own order (vLLM's
    ``--scheduling-policy priority``: lower runs first; a live request has 0, so e.g. 100 lets
    live traffic overtake batch lines). Unset: no ``priority`` field (a server scheduling
    first-come-first-served refuses one)."""
    served_model_name: str = ""
    """The model id clients name in ``body.model``; names the topic ``requests.<id>``. Default:
    the model."""
    lora_adapters: dict[str, str] = Field(default_factory=dict)
    """LoRA adapters of the model, served beside it: ``{"name": "folder", ...}`` (JSON in the
    environment). A line whose ``body.model`` names one runs on this worker with that adapter
    (vLLM's ``--enable-lora --lora-modules``); ``/v1/models`` lists each with this model as its
    ``parent``. Empty: no adapter (LoRA off)."""
    max_loras: int = Field(default=4, ge=1)
    """vLLM ``--max-loras``: adapters the engine holds at once; another one is loaded in place of
    the least recently used (the worker counts these loads, ``adapter_loads_total``)."""
    max_lora_rank: int = Field(default=16, ge=1)
    """vLLM ``--max-lora-rank``: the highest rank of any adapter served."""
    runner: str = "generate"
    """vLLM runner: ``generate`` (chat, completions) or ``pooling`` (an embeddings model, or a
    cross-encoder for score and rerank)."""
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
    step_cost: Literal["auto", "cpu", "gpu"] = "auto"
    """How the engine's steps cost with the lines in them, for the batches' estimated completion
    (``line_progress.py``): ``cpu`` in proportion to the lines, ``gpu`` nearly the same for one
    line as for dozens. ``auto``: the vLLM engine's own platform; ``gpu`` for a remote server. The
    ``sim`` engine uses its own cost model and the ``fake`` one its per-line times."""
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
    its places, and ``engine_queue_lines``). ``priority``: the worker's order (first a line with
    the fewest of its batch's lines on the engine before it, times its project's batches there
    over the fewest batches any project has there: every project gets as many turns, spread over
    its batches); ``fcfs``: arrival order."""
    engine_queue_lines: int = Field(default=-1, ge=-1)
    """Lines let onto the engine beyond the ``max_num_seqs`` it runs: they wait inside vLLM,
    tokenized, and start the moment a sequence ends. -1: as many as ``max_num_seqs``, so when a
    whole wave of sequences ends at once (lines of equal length) the next wave starts at the next
    engine step, not one line at a time as the worker hands each to vLLM (docs/benchmarks.md).
    0: every waiting line waits in the worker. The lines that make way for a young
    batch's line are the newest on the engine, mostly these (``young_batch_lines``); with a share
    of 1 and ``fcfs`` a young line waits behind them. On a shutdown they are drained with the
    running ones (``drain_timeout_s``): up to one more wave."""
    young_batch_lines: int = Field(default=16, ge=0)
    """A batch's first lines in the worker, while it has fewer than this there, are young: each
    goes onto the engine at once, and the newest lines on the engine of the batch with the most
    there are aborted to make room, mostly those waiting inside it (they wait for a place again; a
    running line's work so far is lost): another project's only while the batch's project holds
    fewer than an equal share of the places, else its own project's.
    So a new batch starts at once rather than after running sequences end. 0: no line is young.
    Direct requests are never young."""
    young_batch_others_share: float = Field(default=0.25, ge=0, le=1)
    """While young lines run, the batches without one keep at most this share of the engine's
    ``max_num_seqs`` places (the rest are aborted, and run again once the young lines are done):
    their own project's batches, and another project's only while the young lines' project is
    below an equal share of the places, and never below that equal share.
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
    """How long an idle fetch may wait for requests. Kafka answers a fetch as soon as records
    arrive, so this only bounds an idle poll (a few empty fetches a second); Tansu, the local and
    test broker, holds a fetch this long even when records arrive meanwhile, where aiokafka's
    default, 500, delays a new batch's first lines."""
    commit_interval_s: float = Field(default=WORKER_COMMIT_INTERVAL_S, gt=0)
    """How often the worker commits the offsets of finished lines. The api's dispatcher counts a
    line as queued until it is committed, so a longer interval keeps the topic emptier than the
    workers need (docs/dispatcher.md); each commit is one small request."""
    commit_done_past: bool = True
    """Commit each offset with the count of lines finished past it (its metadata,
    ``done-past-commit=N;read-to=M``), again whenever that count changes: the dispatcher does not meter
    those lines as queued (docs/dispatcher.md). Off: the offset alone; the dispatcher then learns
    of them from the aggregator's results, about a second later. A broker that keeps no commit
    metadata (Tansu) makes it moot."""
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

    @model_validator(mode="after")
    def _model_named(self) -> InferenceSettings:
        if self.engine == "remote":
            if not self.remote_url:
                raise ValueError("the remote engine needs BATCHSTREAM_INFERENCE_REMOTE_URL (its server)")
            if not self.model_id:
                raise ValueError("set BATCHSTREAM_INFERENCE_SERVED_MODEL_NAME to the model's name")
        elif not self.model and self.engine not in ("fake", "sim"):
            raise ValueError("set BATCHSTREAM_INFERENCE_MODEL to the model folder or name")
        return self

    @property
    def model_id(self) -> str:
        return self.served_model_name or self.model

    @property
    def in_flight_limit(self) -> int:
        return self.max_in_flight or IN_FLIGHT_PER_PLACE * self.max_num_seqs


def worker_defaults() -> InferenceSettings:
    """``InferenceSettings`` as they are when nothing is set (no environment read): what an
    object built without the worker's settings (in a test) is given, so it behaves like the
    worker's."""
    return InferenceSettings.model_construct()


def default(field: str) -> Any:
    """``InferenceSettings``' default for ``field``: what a constructor's parameter defaults to,
    so an object built without the settings (in a test) behaves like the worker's."""
    return InferenceSettings.model_fields[field].default
