"""``python -m deploy.local up|down|status``: what ``make up``, ``make down``, ``make status`` run.

A second stack next to the ``make up`` one (a test's, say) needs its own state dir and ports:
``--state-dir DIR`` and, for each port, ``--port NAME=N`` (a field of ``Ports``), or the
``BATCHSTREAM_*`` address settings ``Ports.from_settings`` reads.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated

import typer

from deploy.local import supervisor
from deploy.local.brokers import DEFAULT_BROKER, Broker, parse_broker
from deploy.local.catalogue import ModelSpec
from deploy.local.ports import Ports
from deploy.local.stack import DEFAULT_STATE_DIR, Stack

app = typer.Typer(
    help="The no-Docker local stack: stand-in servers, api, aggregator, inference workers.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
PORT_NAMES = [f.name for f in dataclasses.fields(Ports)]
StateDir = Annotated[Path, typer.Option(help="PID files, logs and data live here.")]
PortOption = Annotated[
    list[str] | None,
    typer.Option(
        "--port",
        metavar="NAME=N",
        help=f"A port other than the default (repeatable); NAME: {', '.join(PORT_NAMES)}.",
    ),
]


def ports(overrides: list[str] | None = None) -> Ports:
    """``Ports.from_settings()`` with each ``NAME=N`` of ``overrides`` applied."""
    chosen: dict[str, int] = {}
    for item in overrides or []:
        name, _, value = item.partition("=")
        if name not in PORT_NAMES or not value.isdigit():
            raise typer.BadParameter(f"{item!r}: expected NAME=N, NAME one of {', '.join(PORT_NAMES)}")
        chosen[name] = int(value)
    return dataclasses.replace(Ports.from_settings(), **chosen)


def build_stack(
    state_dir: Path,
    models: list[str] | None = None,
    inference_python: str | None = None,
    port: list[str] | None = None,
    engine: str = "vllm",
    remote: list[str] | None = None,
    adapters: list[str] | None = None,
    broker: str = DEFAULT_BROKER,
) -> Stack:
    """The stack a command works on: its state dir, ports, models (each on ``engine``), the
    models forwarded to servers (``remote``: ``NAME=URL``), and LoRA adapters (``adapters``:
    ``NAME=DIR``, each served by the first model) and its Kafka broker: the one running, else
    ``broker`` (started by ``up``)."""
    specs = [dataclasses.replace(ModelSpec.parse(m), engine=engine) for m in models or []]
    try:
        specs += [ModelSpec.parse_remote(r) for r in remote or []]
        for adapter in adapters or []:
            if not specs:
                raise ValueError("an --adapter needs a --model to serve it")
            specs[0] = specs[0].with_adapter(adapter)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    stack = Stack(state_dir, ports=ports(port), models=specs, broker=_broker(broker))
    stack.broker = stack.running_broker() or stack.broker  # what status and down describe
    if inference_python:
        stack.inference_python = inference_python
    return stack


def _broker(name: str) -> Broker:
    try:
        return parse_broker(name)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


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
    engine: Annotated[
        str, typer.Option(help="vllm, or fake: instant answers without a model (tests; DIR may be empty).")
    ] = "vllm",
    remote: Annotated[
        list[str] | None,
        typer.Option(
            metavar="NAME=URL[:pooling]",
            help="A model served by an OpenAI-compatible server you run (repeatable): a worker "
            "with no model of its own forwards its lines there.",
        ),
    ] = None,
    adapter: Annotated[
        list[str] | None,
        typer.Option(
            metavar="NAME=DIR", help="A LoRA adapter the first model serves beside it (repeatable)."
        ),
    ] = None,
    broker: Annotated[
        str,
        typer.Option(
            help="The Kafka broker: tansu (memory only) or noida (noida-db, data kept in the state "
            "dir). Used when the broker is started; a running one is left alone."
        ),
    ] = DEFAULT_BROKER,
    port: PortOption = None,
    state_dir: StateDir = DEFAULT_STATE_DIR,
) -> None:
    """Start every component that is not running and healthy; return when all are healthy."""
    stack = build_stack(state_dir, model, inference_python, port, engine, remote, adapter, broker)
    raise typer.Exit(supervisor.up(stack, [s for s in services.split(",") if s]))


@app.command()
def down(state_dir: StateDir = DEFAULT_STATE_DIR) -> None:
    """Stop every process the stack started, by PID, in reverse start order."""
    supervisor.down(build_stack(state_dir))


@app.command()
def status(port: PortOption = None, state_dir: StateDir = DEFAULT_STATE_DIR) -> None:
    """Each component: healthy, running but not ready, or stopped."""
    supervisor.status(build_stack(state_dir, port=port))
