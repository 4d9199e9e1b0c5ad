"""The no-Docker local stack (``make up``) and the test fixtures' stack, one module per concern.

- ``catalogue``: every component's command line, environment, readiness probe, start order.
- ``brokers``: the Kafka-protocol brokers a stack can run (Tansu, noida-db): their command lines
  and what the services on each are set to.
- ``ports``: the fixed ports of ``make up``, and ``free_ports()`` / ``free_port()`` for tests.
- ``processes``: start detached, tell alive, stop a process tree by PID (psutil).
- ``probes``: readiness probes and the one polling loop (tenacity).
- ``stack``: ``Stack``, one stack's state dir, addresses, its components' start/stop/status and its
  data (topics, bucket, API keys of other projects).
- ``supervisor``: ``up``/``down``/``status`` as ``make`` runs them, and the broker-loss policy.
- ``cli``: ``python -m deploy.local up|down|status`` (typer).
- ``models``: prepares the models ``make up`` and the tests serve.
- ``model_server``: an OpenAI-compatible model server as a process on a free port (start, wait
  healthy, kill).
- ``vllm_serve``: a real ``vllm serve`` on a free port (the remote engine's tests and benchmark).

Tests, bench and scripts import the names below from here (or a name from the module that defines
it); this list is the one place they are written.
"""

from deploy.local.catalogue import REPO_ROOT, SERVICES, STAND_INS, ModelSpec
from deploy.local.errors import StackError
from deploy.local.ports import Ports, free_port, free_ports
from deploy.local.stack import Outcome, Stack
from deploy.local.supervisor import up

__all__ = [
    "REPO_ROOT",
    "SERVICES",
    "STAND_INS",
    "ModelSpec",
    "Outcome",
    "Ports",
    "Stack",
    "StackError",
    "free_port",
    "free_ports",
    "up",
]
