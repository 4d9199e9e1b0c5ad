"""Services do not import each other: each runs in its own process and environment (the
inference worker's has vLLM and no faust), so what two services share lives in ``shared/``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVICES = sorted(p.name for p in (ROOT / "services").iterdir() if (p / "__init__.py").exists())


def imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


@pytest.mark.parametrize("service", SERVICES)
def test_a_service_imports_no_other_service(service: str) -> None:
    others = {f"services.{name}" for name in SERVICES if name != service}
    found = [
        f"{path.relative_to(ROOT)}: {name}"
        for path in sorted((ROOT / "services" / service).rglob("*.py"))
        for name in imported(path)
        if any(name == other or name.startswith(other + ".") for other in others)
    ]
    assert not found, found


def test_every_service_is_checked() -> None:
    assert {"api", "inference", "aggregator"} <= set(SERVICES)
