"""Every engine against the one engine contract (``tests/unit/inference/engine_contract.py``).

The fake engine runs the checks in this process. The vLLM engine (the tiny model) runs them in
the inference environment, started once for the module; each check is still its own test here.
The remote engine runs them in this process against the session's real ``vllm serve`` of the tiny
model.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from services.inference.fake_engine import FakeEngine
from services.inference.remote_engine import RemoteEngine
from services.inference.settings import InferenceSettings
from tests.support.vllm_server import VllmServer
from tests.unit.inference.engine_contract import CHECKS, run_checks

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def vllm_outcomes() -> dict[str, str]:
    """Every check's outcome on the vLLM engine: one engine start for the whole module."""
    python = os.environ.get("BATCHSTREAM_TEST_INFERENCE_PYTHON", "")
    model_dir = os.environ.get("BATCHSTREAM_TEST_MODEL_DIR", "")
    if not python or not model_dir:
        pytest.skip("the vLLM engine needs BATCHSTREAM_TEST_INFERENCE_PYTHON and BATCHSTREAM_TEST_MODEL_DIR")
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    done = subprocess.run(
        [python, "-m", "tests.unit.inference.engine_contract", "--model", model_dir],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("CONTRACT ")]
    if not lines:
        sys.stderr.write(done.stderr[-5000:])
        pytest.fail(f"the vLLM contract run printed no outcome (exit {done.returncode})")
    outcomes: dict[str, str] = json.loads(lines[-1].removeprefix("CONTRACT "))
    return outcomes


@pytest.fixture(scope="module")
def remote_outcomes(vllm_server: VllmServer) -> dict[str, str]:
    """Every check's outcome on the remote engine against the module's server."""

    async def run() -> dict[str, str]:
        settings = InferenceSettings(
            engine="remote",
            remote_url=vllm_server.url + "/v1",
            served_model_name=vllm_server.served_name,
            max_num_seqs=8,
        )
        async with RemoteEngine(settings) as engine:
            return await run_checks(engine)

    # Its own loop in a thread: the fixture is first asked for from inside a test's running loop.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, run()).result()


@pytest.mark.parametrize("name", list(CHECKS))
@pytest.mark.parametrize("engine", ["fake", "vllm", "remote"])
async def test_engine_keeps_the_contract(engine: str, name: str, request: pytest.FixtureRequest) -> None:
    if engine == "fake":
        # Slow enough per token that the contract's long request runs until it is stopped.
        await CHECKS[name](FakeEngine(seconds_per_token=0.02))
        return
    outcome = request.getfixturevalue(f"{engine}_outcomes")[name]
    assert outcome == "ok", outcome
