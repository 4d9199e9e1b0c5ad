"""The whole stack for end-to-end tests: stand-ins + api + aggregator + one inference worker.

The worker runs vLLM on the tiny model from ``BATCHSTREAM_TEST_MODEL_DIR`` with the interpreter in
``BATCHSTREAM_TEST_INFERENCE_PYTHON`` (``make test`` sets both). With
``BATCHSTREAM_TEST_INFERENCE_ENGINE=fake`` it runs the instant fake engine from this environment
instead, and needs neither. Without them, tests that use ``stack`` are skipped.

``own_stack`` is for a module that wants services of its own (other settings, an aggregator it can
kill): a stack on the session's stand-in servers with its own topic prefix, database, bucket and
service ports.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
from pymongo import MongoClient

from deploy.local import ModelSpec, Stack, free_ports
from tests.support.waiting import wait_until

TEST_MODEL_NAME = os.environ.get("BATCHSTREAM_TEST_MODEL_NAME", "tiny-llama")
UNSERVED_MODEL = "unserved-model"


def _test_model() -> tuple[ModelSpec, str]:
    """The model the worker serves and the interpreter it runs with; skips when not configured."""
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


@pytest.fixture(scope="session")
def stack(stand_ins: Stack) -> Iterator[Stack]:
    """The running stack; ``stack.base_url``, ``stack.api_key``, ``stack.env()``."""
    model, python = _test_model()
    stand_ins.models = [model]
    if python:
        stand_ins.inference_python = python
    services = ["api", "aggregator", model.component]
    try:
        stand_ins.provision()
        stand_ins.start(services)
        yield stand_ins
    finally:
        stand_ins.stop(services)


@pytest.fixture(scope="session")
def mongo_db(stack: Stack) -> Iterator[Any]:
    """The stack's database, for what tests read or set behind the api (a sync client)."""
    env = stack.env()
    client: MongoClient[dict[str, Any]] = MongoClient(env["BATCHSTREAM_MONGO_URI"])
    yield client[env["BATCHSTREAM_MONGO_DATABASE"]]
    client.close()


@pytest.fixture(scope="session")
def model_id(stack: Stack) -> str:
    """The served model id requests name in ``model``."""
    return stack.models[0].served_name


@pytest.fixture(scope="session")
def unserved_model(mongo_db: Any) -> str:
    """A model the api knows but no worker serves: its lines wait on Kafka and never run."""
    mongo_db.models.update_one(
        {"_id": UNSERVED_MODEL},
        {"$set": {"created": 1, "max_context_length": 4096, "endpoints": ["/v1/chat/completions"]}},
        upsert=True,
    )
    return UNSERVED_MODEL


OwnStack = Callable[..., AbstractContextManager[Stack]]


def aggregator_processing(stack: Stack) -> bool:
    """The stack's aggregator reports the ``processing`` phase (partitions assigned, recovered)."""
    try:
        answer = httpx.get(f"http://127.0.0.1:{stack.ports.aggregator}/readyz", timeout=5)
        return bool(answer.json().get("phase") == "processing")
    except (httpx.HTTPError, ValueError):
        return False


@pytest.fixture(scope="session")
def own_stack(stand_ins: Stack, tmp_path_factory: pytest.TempPathFactory) -> OwnStack:
    """``with own_stack(name, services, models=..., extra_env=...) as stack:`` for a module fixture.

    The stack shares the stand-ins (Kafka, MongoDB, S3) but has its own topic prefix, database and
    bucket (named after the session's, plus ``name`` and a random suffix), its own api, aggregator
    and inference ports and its own state dir; ``extra_env`` goes to its services. The bucket and
    topics are provisioned, ``services`` started (an aggregator until it owns its partitions and
    counts: healthy, it may still wait seconds for its group, and a test timing the pipeline would
    time that), and on exit every process it started, restarts included, is stopped by PID.
    """

    @contextmanager
    def make(
        name: str,
        services: Iterable[str],
        *,
        models: Iterable[ModelSpec] = (),
        extra_env: Mapping[str, str] | None = None,
    ) -> Iterator[Stack]:
        own = free_ports()
        suffix = f"{name}{uuid.uuid4().hex[:6]}"
        stack = Stack(
            tmp_path_factory.mktemp(f"{name}-stack"),
            ports=replace(stand_ins.ports, api=own.api, aggregator=own.aggregator, inference=own.inference),
            models=list(models),
            topic_prefix=f"{stand_ins.topic_prefix}{suffix}.",
            mongo_database=f"{stand_ins.mongo_database}_{suffix}",
            bucket=f"{stand_ins.bucket}-{suffix}",
            environment="test",
            extra_env=dict(extra_env or {}),
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

    return make
