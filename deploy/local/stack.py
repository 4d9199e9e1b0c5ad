"""One local stack: its state dir (PID files, logs, data), addresses, and its components' lifecycle.

Every process is started detached (its own session and process group), with a PID file and a log
file under the state dir (``.state/`` by default); ``stop`` ends each by PID (``processes``). Starting
is idempotent: a component whose PID is alive and healthy is left alone, a dead one is started again.

In tests::

    stack = Stack(tmp_path, ports=free_ports(), models=[ModelSpec(dir, "tiny-llama")])
    stack.start(STAND_INS); stack.provision(); stack.start(["api", "aggregator", ...])
    os.environ.update(stack.env()) ...; stack.stop()
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Coroutine, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from deploy.local import processes
from deploy.local.brokers import BROKER_SETTINGS, DEFAULT_BROKER, Broker, broker_of
from deploy.local.catalogue import (
    REPO_ROOT,
    Component,
    ModelSpec,
    components,
    start_phase,
    start_rank,
    stop_timeout_s,
    worker_health,
)
from deploy.local.errors import StackError
from deploy.local.ports import Ports
from deploy.local.probes import Probe, wait_ready
from deploy.local.processes import ProcessRef
from deploy.provision import provision, resume_in_flight
from shared.settings import ApiSettings, KafkaSettings, MongoSettings, StorageSettings

DEFAULT_STATE_DIR = REPO_ROOT / ".state"
T = TypeVar("T")


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
    broker: Broker = DEFAULT_BROKER  # the ``kafka`` component (catalogue: Tansu in memory, or noida-db)
    tuned_for_broker: bool = True  # its services get BROKER_SETTINGS (False: another Kafka serves it)

    def __post_init__(self) -> None:
        self.state_dir = Path(self.state_dir).resolve()
        self.storage = StorageSettings()
        self.bucket = self.bucket or self.storage.bucket
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

    # --- addresses and settings
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
            "BATCHSTREAM_S3_ACCESS_KEY": self.storage.access_key,
            "BATCHSTREAM_S3_SECRET_KEY": self.storage.secret_key,
            "BATCHSTREAM_S3_BUCKET": self.bucket,
            "BATCHSTREAM_S3_SECURE": "false",
            "BATCHSTREAM_S3_REGION": self.storage.region,
            "BATCHSTREAM_API_HOST": "127.0.0.1",
            "BATCHSTREAM_API_PORT": str(p.api),
            "BATCHSTREAM_API_METRICS_PORT": str(p.api_metrics),
            "BATCHSTREAM_API_KEYS": ApiSettings().keys,
            "BATCHSTREAM_AGGREGATOR_WEB_PORT": str(p.aggregator),
            "BATCHSTREAM_AGGREGATOR_DATA_DIR": str(self.data_dir / "aggregator"),
        }
        env.update(self.extra_env)
        return env

    def service_env(self, **extra: str) -> dict[str, str]:
        """A service process's whole environment: what its broker needs (``BROKER_SETTINGS``),
        this process's environment, the stack's settings, then ``extra``."""
        tuned = BROKER_SETTINGS[self.broker] if self.tuned_for_broker else {}
        return {**tuned, **os.environ, **self.env(), "PYTHONUNBUFFERED": "1", **extra}

    def kafka_settings(self) -> KafkaSettings:
        return KafkaSettings(
            bootstrap_servers=f"127.0.0.1:{self.ports.kafka}", topic_prefix=self.topic_prefix
        )

    def storage_settings(self) -> StorageSettings:
        return StorageSettings(endpoint=f"127.0.0.1:{self.ports.s3}", bucket=self.bucket, secure=False)

    def mongo_settings(self) -> MongoSettings:
        env = self.env()
        return MongoSettings(uri=env["BATCHSTREAM_MONGO_URI"], database=self.mongo_database)

    # --- components
    def components(self) -> dict[str, Component]:
        """Every component of this stack (``catalogue``), by name."""
        return components(self)

    def _ref(self, name: str) -> ProcessRef | None:
        try:
            return ProcessRef.loads(self.pid_file(name).read_text())
        except FileNotFoundError:
            return None

    def pid(self, name: str) -> int | None:
        """The component's PID if it is running, else None."""
        ref = self._ref(name)
        return ref.pid if ref is not None and processes.is_running(ref) else None

    def running_broker(self) -> Broker | None:
        """The broker the running ``kafka`` component is (None when none runs, or unknown)."""
        ref = self._ref("kafka")
        return broker_of(processes.command_line(ref)) if ref is not None else None

    def wait_exit(self, name: str, timeout_s: float) -> int | None:
        """The exit status of a component this process started, once it exits (None if this
        process did not start it); ``subprocess.TimeoutExpired`` if it still runs after timeout_s."""
        ref = self._ref(name)
        return processes.wait_exit(ref, timeout_s) if ref is not None else None

    def known(self) -> list[str]:
        """Components with a PID file in the state dir."""
        if not self.run_dir.is_dir():
            return []
        return sorted(sorted(p.stem for p in self.run_dir.glob("*.pid")), key=start_rank)

    def pids(self) -> dict[str, int]:
        return {name: pid for name in self.known() if (pid := self.pid(name)) is not None}

    def status(self) -> dict[str, str]:
        """Each component's state: ``stopped``, ``healthy (pid N)``, ``running, not ready (pid N)``, or
        ``running (pid N)`` for a process whose health cannot be asked. A worker of a model not in
        ``models`` (``make status`` knows no models) is asked on the health port in its
        environment."""
        comps = self.components()
        result = {}
        for name in sorted(set(comps) | set(self.known()), key=start_rank):
            pid = self.pid(name)
            if pid is None:
                result[name] = "stopped"
                continue
            ready = comps[name].ready if name in comps else self._worker_probe(name)
            if ready is None:
                result[name] = f"running (pid {pid})"
            elif ready():
                result[name] = f"healthy (pid {pid})"
            else:
                result[name] = f"running, not ready (pid {pid})"
        return result

    def _worker_probe(self, name: str) -> Probe | None:
        """The health check of a running worker this Stack was not told about, from the health
        port in its environment; None if it has none."""
        ref = self._ref(name)
        return worker_health(processes.environment(ref)) if ref is not None else None

    def start(self, names: Iterable[str] | None = None, *, strict: bool = True) -> list[Outcome]:
        """Start the named components (all by default) and wait until each is ready.

        The stand-in servers start together, then the services together (each service needs only
        the stand-ins, never another service): a stack is up in the slowest component's start-up
        time rather than the sum of them all.
        """
        comps = self.components()
        wanted = list(names) if names is not None else list(comps)
        unknown = [name for name in wanted if name not in comps]
        if unknown:
            raise StackError(f"unknown component {unknown[0]!r}; known: {', '.join(comps)}")
        outcomes: list[Outcome] = []
        for phase in sorted({start_phase(name) for name in wanted}):
            group = sorted((n for n in wanted if start_phase(n) == phase), key=start_rank)
            with concurrent.futures.ThreadPoolExecutor(len(group)) as pool:
                started = list(pool.map(lambda name: self._start_one(comps[name]), group))
            outcomes += started
            failed = next((o for o in started if not o.ok), None)
            if strict and failed is not None:
                raise StackError(f"{failed.name} failed: {failed.detail}")
        return outcomes

    def _start_one(self, comp: Component) -> Outcome:
        ref = self._ref(comp.name)
        if ref is not None and processes.is_running(ref):
            if self._wait_ready(comp, ref) == "ready":
                return Outcome(comp.name, "running", f"pid {ref.pid}")
            self.stop([comp.name])  # alive but never healthy: start it again
        else:
            self._forget(comp.name)
        ref = self._spawn(comp)
        state = self._wait_ready(comp, ref)
        if state != "ready":
            why = {"exited": "exited during start-up"}.get(
                state, f"not ready after {comp.start_timeout_s:.0f} s"
            )
            tail = self.log_tail(comp.name)
            self.stop([comp.name])
            return Outcome(comp.name, "failed", f"{why}; see {self.log_file(comp.name)}\n{tail}")
        return Outcome(comp.name, "started", f"pid {ref.pid}")

    def _spawn(self, comp: Component) -> ProcessRef:
        for d in (self.run_dir, self.log_dir, self.data_dir):
            d.mkdir(parents=True, exist_ok=True)
        if comp.prepare:
            comp.prepare()
        ref = processes.spawn_detached(comp.argv, comp.env, REPO_ROOT, self.log_file(comp.name))
        self.pid_file(comp.name).write_text(ref.dumps())
        return ref

    def _wait_ready(self, comp: Component, ref: ProcessRef) -> str:
        if comp.ready():  # the common case for a component left running: no wait at all
            return "ready"
        return wait_ready(comp.ready, lambda: processes.is_running(ref), comp.start_timeout_s)

    def stop(self, names: Iterable[str] | None = None, *, timeout_s: float | None = None) -> None:
        """Stop the named components (default: every one with a PID file), in reverse order; each
        gets its own SIGTERM grace (``catalogue``), or ``timeout_s``, before SIGKILL. A stopped
        (SIGSTOP) component is continued first, all of them before any is stopped."""
        wanted = list(names) if names is not None else self.known()
        refs = {name: self._ref(name) for name in wanted}
        for ref in refs.values():  # all continued first: a draining service needs the others
            if ref is not None:
                processes.resume(ref)
        for name in sorted(wanted, key=start_rank, reverse=True):
            ref = refs[name]
            if ref is not None:
                processes.stop_tree(ref, stop_timeout_s(name) if timeout_s is None else timeout_s)
            self._forget(name)

    def _forget(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.pid_file(name).unlink()

    # --- data
    def provision(self, models: Iterable[str] | None = None, timeout_s: float = 60.0) -> None:
        """Create the bucket and the topics (results, control, requests.<model> per model)."""
        served = (
            list(models) if models is not None else list(dict.fromkeys(m.served_name for m in self.models))
        )
        _run(provision(self.kafka_settings(), self.storage_settings(), served, timeout_s))

    def resume_in_flight(self) -> list[str]:
        """Batches in flight when the broker lost its data run again (``deploy.provision``)."""
        return _run(resume_in_flight(self.mongo_settings(), self.storage_settings()))

    def create_key(self, project: str) -> str:
        """A new API key of ``project`` on this stack's database, made the way an operator makes
        one (``batchstream keys create``), for tests and benchmarks that need a second project."""
        out = subprocess.run(
            [self.main_python, "-m", "services.client", "keys", "create", "--project", project],
            env=self.service_env(),
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
        return out.stdout.strip()

    def reset_aggregator_state(self) -> None:
        """Empty the aggregator's local data dir (used when the broker forgot everything)."""
        shutil.rmtree(self.data_dir / "aggregator", ignore_errors=True)

    def log_tail(self, name: str, lines: int = 15) -> str:
        try:
            text = self.log_file(name).read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join("    " + line for line in text.splitlines()[-lines:])


def _run(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to the end in a fresh loop, also from inside a running one (async tests)."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()
