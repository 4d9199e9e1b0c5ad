"""Stacks for the integration tests: the model the session's worker serves, stacks of a module's
own on the session's stand-in servers, and the settings every fake-engine stack starts from.

- ``session_model``: the session stack's model and interpreter, from ``BATCHSTREAM_TEST_*``.
- ``own_stack``: a stack sharing the stand-ins, with its own topics, database, bucket and ports
  (the ``own_stack`` fixture hands it out as ``OwnStack``).
- ``aggregator_processing``: whether a stack's aggregator owns its partitions and counts.
- ``extra_api``: another api process on a stack, with some settings changed.
- ``FAKE_STACK_ENV``: the aggregator settings of a stack on the instant fake engine.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from deploy.local import ModelSpec, Stack, free_port, free_ports
from tests.support.real_servers import runs_on_tansu
from tests.support.waiting import wait_until

TEST_MODEL_NAME = os.environ.get("BATCHSTREAM_TEST_MODEL_NAME", "tiny-llama")

# Tansu's workarounds: one-record producer batches (its ListOffsets LATEST is wrong for
# multi-record batches, which faust's table recovery trusts) and no standby. On any other broker
# the aggregator keeps the defaults it has on Apache Kafka.
TANSU_AGGREGATOR_ENV = {
    "BATCHSTREAM_AGGREGATOR_PRODUCER_MAX_BATCH_SIZE": "1",
    "BATCHSTREAM_AGGREGATOR_STANDBY_REPLICAS": "0",
}

# Short chunk, flush and group timings so small batches end in about a second, plus the
# broker's workarounds.
FAKE_STACK_ENV = {
    "BATCHSTREAM_AGGREGATOR_CHUNK_SECONDS": "0.2",
    "BATCHSTREAM_AGGREGATOR_COUNTS_FLUSH_SECONDS": "0.3",
    "BATCHSTREAM_AGGREGATOR_SWEEP_SECONDS": "1",
    "BATCHSTREAM_AGGREGATOR_SESSION_TIMEOUT_S": "6",
    "BATCHSTREAM_AGGREGATOR_HEARTBEAT_INTERVAL_S": "1",
    "BATCHSTREAM_AGGREGATOR_REBALANCE_TIMEOUT_S": "6",
    "BATCHSTREAM_AGGREGATOR_COMMIT_INTERVAL_S": "0.5",
    **(TANSU_AGGREGATOR_ENV if runs_on_tansu() else {}),
}

OwnStack = Callable[..., AbstractContextManager[Stack]]
"""``own_stack(name, services, models=..., extra_env=...)`` with the session's stand-ins bound."""


def session_model() -> tuple[ModelSpec, str]:
    """The model the worker serves and the interpreter it runs with; skips when not configured.

    ``BATCHSTREAM_TEST_INFERENCE_ENGINE=fake``: the instant fake engine in this environment (no
    interpreter). Otherwise vLLM on ``BATCHSTREAM_TEST_MODEL_DIR`` with the interpreter in
    ``BATCHSTREAM_TEST_INFERENCE_PYTHON``."""
    if os.environ.get("BATCHSTREAM_TEST_INFERENCE_ENGINE") == "fake":
        return ModelSpec("", TEST_MODEL_NAME, engine="fake"), ""
    python = os.environ.get("BATCHSTREAM_TEST_INFERENCE_PYTHON", "")
    model_dir = os.environ.get("BATCHSTREAM_TEST_MODEL_DIR", "")
    if not python or not model_dir:
        pytest.skip(
            "end-to-end tests need BATCHSTREAM_TEST_INFERENCE_PYTHON (the .venv-inference python) "
            "and BATCHSTREAM_TEST_MODEL_DIR (the tiny model; `make test` prepares both), or "
            "BATCHSTREAM_TEST_INFERENCE_ENGINE=fake"
        )
    if not Path(python).exists() or not Path(model_dir).is_dir():
        pytest.skip(f"missing {python} or {model_dir}: run `make venvs` and `make test`")
    return ModelSpec(model_dir, TEST_MODEL_NAME), python


def aggregator_processing(stack: Stack) -> bool:
    """The stack's aggregator reports the ``processing`` phase (partitions assigned, recovered)."""
    try:
        answer = httpx.get(f"http://127.0.0.1:{stack.ports.aggregator}/readyz", timeout=5)
        return bool(answer.json().get("phase") == "processing")
    except (httpx.HTTPError, ValueError):
        return False


@contextmanager
def own_stack(
    stand_ins: Stack,
    state_dir: Path,
    name: str,
    services: Iterable[str],
    *,
    models: Iterable[ModelSpec] = (),
    extra_env: Mapping[str, str] | None = None,
    inference_python: str = "",
) -> Iterator[Stack]:
    """A stack on ``stand_ins``' servers, its state in ``state_dir``, while the block runs.

    It has its own topic prefix, database and bucket (named after the stand-ins', plus ``name`` and
    a random suffix), its own api, aggregator and inference ports; ``extra_env`` goes to its
    services, and a vLLM worker runs on ``inference_python`` (default: the stand-ins'). The bucket
    and topics are provisioned, ``services`` started (an aggregator until it owns its partitions
    and counts: healthy, it may still wait seconds for its group, and a test timing the pipeline
    would time that), and on exit every process it started, restarts included, is stopped by PID.
    """
    own = free_ports()
    suffix = f"{name}{uuid.uuid4().hex[:6]}"
    stack = Stack(
        state_dir,
        ports=replace(
            stand_ins.ports,
            api=own.api,
            api_metrics=own.api_metrics,
            aggregator=own.aggregator,
            inference=own.inference,
        ),
        models=list(models),
        broker=stand_ins.broker,
        tuned_for_broker=stand_ins.tuned_for_broker,
        topic_prefix=f"{stand_ins.topic_prefix}{suffix}.",
        mongo_database=f"{stand_ins.mongo_database}_{suffix}",
        bucket=f"{stand_ins.bucket}-{suffix}",
        environment="test",
        extra_env=dict(extra_env or {}),
        inference_python=inference_python or stand_ins.inference_python,
    )
    wanted = list(services)
    try:
        stack.provision()
        stack.start(wanted)
        if "aggregator" in wanted:
            wait_until(lambda: aggregator_processing(stack), 90, "the aggregator to own its partitions")
        yield stack
    finally:
        stack.stop()  # every component with a PID file in this stack's own state dir


@contextmanager
def extra_api(stack: Stack, **overrides: str) -> Iterator[str]:
    """Another api process on the same stack with some settings changed; yields its base URL."""
    port = free_port()
    env = {
        **os.environ,
        **stack.env(),
        "BATCHSTREAM_API_PORT": str(port),
        "BATCHSTREAM_API_METRICS_PORT": "0",  # the stack's own api serves them on its port
        **overrides,
    }
    command = [sys.executable, "-m", "uvicorn", "services.api.app:create_app", "--factory"]
    proc = subprocess.Popen(
        [*command, "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"

    def answering() -> bool:
        assert proc.poll() is None, "the extra api exited"
        try:
            return httpx.get(f"{base}/health", timeout=2).status_code in (200, 503)
        except httpx.HTTPError:
            return False

    try:
        wait_until(answering, 60, "the extra api")
        yield base
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
