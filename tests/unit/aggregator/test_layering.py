"""The processing core imports no faust: it runs (and is tested) without the framework."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

AGGREGATOR = Path(__file__).resolve().parents[3] / "services" / "aggregator"
FAUST_FREE = [
    "intake",
    "counting",
    "state",
    "finalize",
    "chunks",
    "overdue",
    "watchdog",
    "supervisor",
    "offset_gaps",
    "pages",
]
FRAMEWORK = {"faust", "mode", "aiokafka"}


def imported_roots(path: Path) -> set[str]:
    roots: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def test_core_modules_do_not_import_faust_directly() -> None:
    for name in FAUST_FREE:
        assert not imported_roots(AGGREGATOR / f"{name}.py") & FRAMEWORK, name


def test_core_modules_import_without_faust_in_the_process() -> None:
    """Nothing they import pulls faust in either (checked in a fresh interpreter)."""
    modules = ", ".join(f"services.aggregator.{name}" for name in FAUST_FREE)
    code = (
        f"import sys, {modules}\n"
        f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {FRAMEWORK!r})\n"
        "assert not bad, bad"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
