"""The whole stack for end-to-end tests: stand-ins + api + aggregator + one inference worker.

The worker runs vLLM on the tiny model from ``BATCHSTREAM_TEST_MODEL_DIR`` with the interpreter in
``BATCHSTREAM_TEST_INFERENCE_PYTHON`` (``make test`` sets both). With
``BATCHSTREAM_TEST_INFERENCE_ENGINE=fake`` it runs the instant fake engine from this environment
instead, and needs neither. Without them, tests that use ``stack`` are skipped.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from deploy.local.stack import ModelSpec, Stack

TEST_MODEL_NAME = os.environ.get("BATCHSTREAM_TEST_MODEL_NAME", "tiny-llama")


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
def model_id(stack: Stack) -> str:
    """The served model id requests name in ``model``."""
    return stack.models[0].served_name
