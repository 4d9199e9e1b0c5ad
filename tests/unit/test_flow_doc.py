"""docs/flow.md walks one line's path through the code: every file and name in its tables exists,
its steps are numbered in order, its figures are those of its tables, and the hand-offs it says
are calls by name are calls by name in the code."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
PAGE = REPO_ROOT / "docs" / "flow.md"
_NAME = re.compile(r"`([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)`")
_FIGURES = re.compile(r"\*\*(\d+) files hold a step; a line crosses (\d+) files in all\.\*\*")


@dataclass(frozen=True)
class Row:
    step: int | None  # None: a file the step above calls and returns from
    path: str
    names: tuple[str, ...]


def rows() -> list[Row]:
    found = []
    for line in PAGE.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 5 or not cells[1].startswith("`"):
            continue
        step = None if cells[0] == "·" else int(cells[0])
        found.append(Row(step, cells[1].strip("`"), tuple(_NAME.findall(cells[2]))))
    return found


def _defined(path: Path, dotted: str) -> bool:
    """Whether the module at ``path`` defines ``dotted`` (a function, class, method or constant),
    read from its source: for a module whose third-party imports are not installed here."""
    scope: list[ast.stmt] = ast.parse(path.read_text()).body
    for part in dotted.split("."):
        match: ast.stmt | None = None
        for node in scope:
            if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.name == part:
                match = node
            elif isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(t, ast.Name) and t.id == part for t in targets):
                    match = node
        if match is None:
            return False
        scope = match.body if isinstance(match, ast.ClassDef) else []
    return True


def resolve(path: str, dotted: str) -> Any:
    module_name = path.removesuffix(".py").replace("/", ".")
    try:
        target: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.split(".")[0] in {"services", "shared"}:
            raise
        assert _defined(REPO_ROOT / path, dotted), f"{path} defines no {dotted}"
        return None
    for part in dotted.split("."):
        assert hasattr(target, part), f"{path} has no {dotted}"
        target = getattr(target, part)
    return target


ROWS = rows()


def test_the_page_has_a_step_for_each_service() -> None:
    paths = [row.path for row in ROWS if row.step is not None]
    for service in ("services/api/", "services/inference/", "services/aggregator/"):
        assert any(p.startswith(service) for p in paths), service


@pytest.mark.parametrize("row", ROWS, ids=lambda row: f"{row.path}:{','.join(row.names)}")
def test_every_file_and_name_exists(row: Row) -> None:
    assert (REPO_ROOT / row.path).is_file(), row.path
    for name in row.names:
        resolve(row.path, name)


def test_steps_are_numbered_in_order() -> None:
    steps = [row.step for row in ROWS if row.step is not None]
    assert steps == list(range(1, len(steps) + 1))


def test_the_figures_are_those_of_the_tables() -> None:
    found = _FIGURES.search(PAGE.read_text())
    assert found is not None, "the page states how many files hold a step and how many are crossed"
    step_files = {row.path for row in ROWS if row.step is not None}
    all_files = {row.path for row in ROWS}
    assert (int(found[1]), int(found[2])) == (len(step_files), len(all_files))


def test_the_hand_offs_the_page_names_are_calls_by_name() -> None:
    """The batch service wakes its dispatcher itself; a batch's end records its webhook event in
    the store's guarded move; the worker's handler takes a place and calls the engine itself."""
    service = resolve("services/api/service/batches.py", "BatchService")
    assert "self.dispatcher.wake()" in inspect.getsource(service._process_once)
    assert "dispatcher" in inspect.signature(service).parameters
    store = resolve("shared/stores/batches.py", "BatchStore")
    assert "self._events.batch_ended(" in inspect.getsource(store._move)
    handler = resolve("services/inference/handler.py", "RequestHandler")
    run = inspect.getsource(handler._run)
    assert "self.scheduler.place(" in run and "self._answer(" in run
