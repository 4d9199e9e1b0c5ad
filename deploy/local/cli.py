"""``python -m deploy.local up|down|status``: what ``make up``, ``make down``, ``make status`` run."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from deploy.local import supervisor
from deploy.local.catalogue import ModelSpec
from deploy.local.ports import Ports
from deploy.local.stack import DEFAULT_STATE_DIR, Stack

app = typer.Typer(
    help="The no-Docker local stack: stand-in servers, api, aggregator, inference workers.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
StateDir = Annotated[Path, typer.Option(help="PID files, logs and data live here.")]


def _stack(state_dir: Path, models: list[str] | None = None, inference_python: str | None = None) -> Stack:
    stack = Stack(state_dir, ports=Ports.from_settings(), models=[ModelSpec.parse(m) for m in models or []])
    if inference_python:
        stack.inference_python = inference_python
    return stack


@app.command()
def up(
    model: Annotated[
        list[str] | None,
        typer.Option(metavar="DIR=NAME[:RUNNER]", help="A model to serve (repeatable); RUNNER: pooling."),
    ] = None,
    services: Annotated[
        str, typer.Option(help="Services to start after the stand-ins (comma separated; '' for none).")
    ] = "api,aggregator,inference",
    inference_python: Annotated[str | None, typer.Option(help="The .venv-inference interpreter.")] = None,
    state_dir: StateDir = DEFAULT_STATE_DIR,
) -> None:
    """Start every component that is not running and healthy; return when all are healthy."""
    stack = _stack(state_dir, model, inference_python)
    raise typer.Exit(supervisor.up(stack, [s for s in services.split(",") if s]))


@app.command()
def down(state_dir: StateDir = DEFAULT_STATE_DIR) -> None:
    """Stop every process the stack started, by PID, in reverse start order."""
    supervisor.down(_stack(state_dir))


@app.command()
def status(state_dir: StateDir = DEFAULT_STATE_DIR) -> None:
    """Each component: healthy, running but not ready, or stopped."""
    supervisor.status(_stack(state_dir))
