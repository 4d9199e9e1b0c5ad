"""What ``make up``, ``make down`` and ``make status`` do with a stack, and the broker-loss policy.

Broker persistence: the default broker keeps its data in memory (Tansu's ``memory://`` store), so it
forgets every topic, message and committed offset when it stops (this build of Tansu has no file
store, only ``memory://`` and ``s3://``). ``--broker noida`` runs noida-db instead, which keeps its
data under the state dir across ``down``/``up`` (a SIGKILL loses what it acknowledged last:
docs/testing.md). What ``up`` does about either: it recreates the topics every time, and when it
(re)starts the broker it restarts every service (the aggregator with an empty local data dir), so
no consumer keeps state that refers to offsets the broker may no longer have. MongoDB and
object-store data persist across ``down``/``up``; batches that were in flight when the broker
stopped resume: ``up`` tallies their stored results (``deploy.provision.resume_in_flight``) and
the api, starting, publishes only their lines without a result (on noida-db the lines still in
the topic past the workers' committed offsets run again too; the aggregator counts each once).
``make clean`` removes all state.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Sequence

from deploy.local.catalogue import SERVICES, STAND_INS, ModelSpec
from deploy.local.stack import Outcome, Stack


def up(stack: Stack, services: Sequence[str]) -> int:
    """Start what is not running (stand-ins, then ``services``), print a summary; 0 if all healthy.

    ``services`` names ``api``, ``aggregator`` and ``inference`` (every model's worker).
    """
    broker_lost = stack.pid("kafka") is None
    if broker_lost:
        # Before the new broker exists: a service from before would otherwise write to it (results,
        # changelog records of the state about to be reset) until it is stopped below. Without a
        # grace: with the broker gone there is nothing to hand back or commit, and a worker and an
        # aggregator draining against it took their whole stop timeouts (45 s + 30 s, measured);
        # their state is reset and the batches resumed from their stored results anyway.
        stop_services(stack, timeout_s=BROKER_LOST_STOP_TIMEOUT_S)
    outcomes = stack.start(STAND_INS, strict=False)
    if all(o.ok for o in outcomes):
        if broker_lost:
            recover_from_broker_loss(stack)
        stack.provision()
        names = [s for s in services if s in SERVICES]
        if "inference" in services:
            names += [m.component for m in stack.models]
        outcomes += stack.start(names, strict=False)
    print_summary(stack, outcomes)
    return 0 if all(o.ok for o in outcomes) else 1


def recover_from_broker_loss(stack: Stack) -> None:
    """A new broker has no topics, offsets or changelogs: consumer state from before is stale, and
    batches in flight lost their messages. Restart every service and have the api publish those
    batches again."""
    stop_services(stack)
    stack.reset_aggregator_state()
    resumed = stack.resume_in_flight()
    if resumed:
        print(
            f"the broker had lost its data: {len(resumed)} batch(es) in flight resume with their lines "
            f"that have no result yet: {', '.join(resumed)}"
        )


BROKER_LOST_STOP_TIMEOUT_S = 2.0


def stop_services(stack: Stack, timeout_s: float | None = None) -> None:
    """Stop every component that is not a stand-in server (api, aggregator, workers), all at once:
    with the broker gone none has anything to hand to another, so the order does not matter, and
    one after the other their graces added up (measured: about 4 s of a 17 s recovery, now 2)."""
    names = [n for n in stack.known() if n not in STAND_INS]
    if names:
        with concurrent.futures.ThreadPoolExecutor(len(names)) as pool:
            list(pool.map(lambda name: stack.stop([name], timeout_s=timeout_s), names))


def print_summary(stack: Stack, outcomes: Sequence[Outcome]) -> None:
    comps = stack.components()
    failed = [o for o in outcomes if not o.ok]
    print("\nbatchstream local stack")
    for o in outcomes:
        mark = {"running": "ok (already running)", "started": "ok (started)"}.get(o.state, "FAILED")
        print(f"  {o.name:<28} {mark:<22} {comps[o.name].description}")
    for o in failed:
        print(f"\n{o.name} failed: {o.detail}")
    print(
        f"\n  base URL : {stack.base_url}\n"
        f"  API key  : {stack.api_key}\n"
        f"  models   : {', '.join(_served(m) for m in stack.models) or '(none)'}\n"
        f"  logs     : {stack.log_dir}/<component>.log\n"
        f"  stop with: make down"
    )
    if failed:
        print(f"\n{len(failed)} component(s) failed: {', '.join(o.name for o in failed)}")


def down(stack: Stack) -> list[str]:
    """Stop every component with a PID file, in reverse start order; the names stopped."""
    names = stack.known()
    stack.stop()
    print(f"stopped: {', '.join(names) or 'nothing was running'}")
    return names


def status(stack: Stack) -> dict[str, str]:
    """Print and return each component's state."""
    states = stack.status()
    for name, state in states.items():
        print(f"{name:<28} {state}")
    return states


def _served(model: ModelSpec) -> str:
    """A model's name in the summary, with its LoRA adapters."""
    adapters = ", ".join(name for name, _ in model.adapters)
    return f"{model.served_name} (adapters: {adapters})" if adapters else model.served_name
