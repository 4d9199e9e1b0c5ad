"""The whole stack for end-to-end tests: stand-ins + api + aggregator + one inference worker.

The worker runs vLLM on the tiny model from ``BATCHSTREAM_TEST_MODEL_DIR`` with the interpreter in
``BATCHSTREAM_TEST_INFERENCE_PYTHON`` (``make test`` sets both). With
``BATCHSTREAM_TEST_INFERENCE_ENGINE=fake`` it runs the instant fake engine from this environment
instead, and needs neither. Without them, tests that use ``stack`` are skipped.

``own_stack`` is for a module that wants services of its own (other settings, an aggregator it can
kill): a stack on the session's stand-in servers with its own topic prefix, database, bucket and
service ports. The code behind these fixtures is in ``tests.support.stacks``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import pytest
from pymongo import MongoClient

from deploy.local import Stack
from tests.support import stacks
from tests.support.stacks import OwnStack, session_model
from tests.support.vllm_server import VllmServer, vllm_serve

UNSERVED_MODEL = "unserved-model"
SESSION_CANCEL_TIMEOUT_S = 5


@pytest.fixture(scope="session")
def stack(stand_ins: Stack) -> Iterator[Stack]:
    """The running stack; ``stack.base_url``, ``stack.api_key``, ``stack.env()``."""
    model, python = session_model()
    stand_ins.models = [model]
    if python:
        stand_ins.inference_python = python
    services = ["api", "aggregator", model.component]
    # A cancelled batch's lines that no worker answers are filled in after this (the default is
    # a minute): the tests that cancel a batch on a model no worker serves end within seconds.
    stand_ins.extra_env["BATCHSTREAM_AGGREGATOR_CANCEL_TIMEOUT_S"] = str(SESSION_CANCEL_TIMEOUT_S)
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


@pytest.fixture(scope="session")
def own_stack(stand_ins: Stack, tmp_path_factory: pytest.TempPathFactory) -> OwnStack:
    """``with own_stack(name, services, models=..., extra_env=...) as stack:`` for a module fixture:
    ``tests.support.stacks.own_stack`` on the session's stand-ins, in a tmp dir of its own."""

    def make(name: str, services: Iterable[str], **kwargs: Any) -> AbstractContextManager[Stack]:
        return stacks.own_stack(stand_ins, tmp_path_factory.mktemp(f"{name}-stack"), name, services, **kwargs)

    return make


@pytest.fixture(scope="session")
def vllm_server() -> Iterator[VllmServer]:
    """A real ``vllm serve`` of the tiny model, for the remote engine (started at first use, once
    per session; a test that kills it starts it again)."""
    with vllm_serve("served-model") as server:
        yield server
