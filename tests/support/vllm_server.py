"""The session's real ``vllm serve`` of the test model (``deploy.local.vllm_serve``): the server a
team already runs, for the remote engine's tests (``vllm_server`` in the integration conftest).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from deploy.local import StackError
from deploy.local.vllm_serve import VllmServer

# The server runs this many sequences at once (its --max-num-seqs), each up to this many tokens.
SERVER_MAX_NUM_SEQS = 8
SERVER_MAX_MODEL_LEN = 16_384

__all__ = ["SERVER_MAX_MODEL_LEN", "SERVER_MAX_NUM_SEQS", "VllmServer", "vllm_serve"]


@contextmanager
def vllm_serve(served_name: str) -> Iterator[VllmServer]:
    """A started server of the test model while the block runs (skips the test when the inference
    environment or the model is not given, as the vLLM engine's tests do)."""
    python = os.environ.get("BATCHSTREAM_TEST_INFERENCE_PYTHON", "")
    model_dir = os.environ.get("BATCHSTREAM_TEST_MODEL_DIR", "")
    if not python or not model_dir:
        pytest.skip("vllm serve needs BATCHSTREAM_TEST_INFERENCE_PYTHON and BATCHSTREAM_TEST_MODEL_DIR")
    # A context far beyond the tiny model's 2,048 positions (its weights are random; vLLM allows
    # it when told to): a line can run long enough that a cancel plainly stops it mid-way.
    server = VllmServer(
        python,
        model_dir,
        served_name,
        "--max-model-len",
        str(SERVER_MAX_MODEL_LEN),
        max_num_seqs=SERVER_MAX_NUM_SEQS,
        env={"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"},
    )
    try:
        try:
            server.start()
        except StackError as exc:
            pytest.fail(str(exc))
        yield server
    finally:
        server.kill(signal.SIGTERM)
