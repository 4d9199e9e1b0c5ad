"""Fault-injection trials: a batch runs while one component is SIGKILLed (its whole process tree) at
a random moment and started again; the batch must still end exact.

One ``ChaosStack`` is a local stack of its own (its own Kafka, MongoDB and S3 stand-ins, api,
aggregator and two instant fake-engine workers of one model), because trials kill the stand-ins
too. A trial (``run_trial``):

1. uploads a batch of ``lines`` chat lines (custom_ids ``c0`` .. ``cN-1``) and creates it;
2. waits until the batch is in the fault's phase (read from MongoDB: ``validating``, in progress
   and not yet emitted, in progress with results counted, ``finalizing``), then a random delay
   drawn from the trial's seed, and kills the component's process group with SIGKILL;
3. starts it again the way the stack does (the broker through ``supervisor.up``, which applies the
   broker-loss policy: every service restarted, the aggregator's local state emptied, batches in
   flight resumed with their lines that have no stored result);
4. measures the recovery time: from the restart call to the first progress seen once the
   component is back (or to the batch's end, if it ends while the component starts);
5. waits for ``completed`` and checks: ``request_counts`` exact, every custom_id exactly once in the
   output or error file, and nothing in flight (no request running on a worker, no results waiting
   for the aggregator).

``Random(seed)`` decides every random choice of a trial, and the trial prints its seed:
``python -m tests.chaos --fault aggregator-finalize --seed 1234`` replays it.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import json
import os
import random
import signal
import statistics
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import psutil
from openai import OpenAI
from pymongo import MongoClient

from deploy.local import STAND_INS, ModelSpec, Stack, free_ports, up
from deploy.local.processes import group_members
from tests.support.lines import chat_request, jsonl, read_lines
from tests.support.metrics import metric_value
from tests.support.real_servers import requested_broker
from tests.support.stacks import FAKE_STACK_ENV
from tests.support.waiting import TERMINAL, wait_until

MODEL = "fake-chaos"
SERVICES = ("api", "aggregator")

# The fake-engine stack's settings, except the aggregator's member name and session and rebalance
# timeouts: those are the local stack's (``catalogue.py``: static membership, 10 s), as ``make up``
# runs it.
CHAOS_ENV = {
    **{
        k: v for k, v in FAKE_STACK_ENV.items() if "SESSION_TIMEOUT" not in k and "REBALANCE_TIMEOUT" not in k
    },
    "BATCHSTREAM_AGGREGATOR_GAP_REWIND_AFTER_S": "2",
    "BATCHSTREAM_AGGREGATOR_GAP_CHECK_SECONDS": "0.5",
}


@dataclass(frozen=True)
class Fault:
    """What a trial breaks: ``component`` in ``phase``, by SIGKILL (or SIGSTOP for a stall)."""

    name: str
    component: str  # "worker" is the first worker, "twin" the second one
    phase: str  # "validating", "emitting", "running", "finalizing"
    max_delay_s: float  # the random moment: this much at most after the phase is seen
    stall: bool = False  # SIGSTOP until the group moves on, then SIGCONT (no restart)
    twin: bool = False  # a second worker of the model runs during the trial


FAULTS = {
    f.name: f
    for f in (
        Fault("api-validation", "api", "validating", 0.05),
        Fault("api-emission", "api", "emitting", 0.3),
        Fault("worker", "worker", "running", 0.5),
        Fault("aggregator-chunks", "aggregator", "running", 0.5),
        Fault("aggregator-finalize", "aggregator", "finalizing", 0.1),
        Fault("mongo", "mongo", "running", 0.5),
        Fault("s3", "s3", "running", 0.5),
        Fault("broker", "kafka", "running", 0.5),
        Fault("two-workers", "twin", "running", 0.5, twin=True),
        Fault("worker-stall", "twin", "running", 0.3, stall=True, twin=True),
    )
}


@dataclass
class TrialResult:
    fault: str
    seed: int
    lines: int
    phase_seen: str  # the batch's phase when the signal was sent
    lost: int
    duplicated: int
    counts_exact: bool
    recovery_s: float | None  # None: the batch had already ended when the component was back
    seconds: float
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def line(self) -> str:
        rec = "n/a" if self.recovery_s is None else f"{self.recovery_s:.1f}s"
        verdict = "ok" if self.ok else "FAILED: " + "; ".join(self.problems)
        return (
            f"chaos trial fault={self.fault} seed={self.seed} lines={self.lines} "
            f"phase={self.phase_seen} lost={self.lost} duplicated={self.duplicated} "
            f"recovery={rec} took={self.seconds:.1f}s {verdict}"
        )


def failed(fault: str, seed: int, lines: int, why: str) -> TrialResult:
    """A trial that raised (e.g. timed out waiting): nothing checked, counted as failed."""
    return TrialResult(fault, seed, lines, "unknown", 0, 0, False, None, 0.0, [why])


class ChaosStack:
    """A stack of its own with two fake-engine workers of one model (``worker`` and ``twin``)."""

    def __init__(
        self, state_dir: Path, *, static_membership: bool = True, static_workers: bool = False
    ) -> None:
        env = dict(CHAOS_ENV)
        if not static_membership:  # the aggregator as it was before (to measure the difference)
            env["BATCHSTREAM_AGGREGATOR_GROUP_INSTANCE_ID"] = ""
            env["BATCHSTREAM_AGGREGATOR_SESSION_TIMEOUT_S"] = "60"  # faust's default
            env["BATCHSTREAM_AGGREGATOR_REBALANCE_TIMEOUT_S"] = "60"
        model = ModelSpec("", MODEL, engine="fake")
        self.worker = model.component
        twin_env = dict(env)
        if static_workers:  # static members: one name each (one name twice fences one out)
            env["BATCHSTREAM_INFERENCE_GROUP_INSTANCE_ID"] = self.worker
            twin_env["BATCHSTREAM_INFERENCE_GROUP_INSTANCE_ID"] = f"{self.worker}-twin"
        self.stack = Stack(
            state_dir / "main",
            ports=free_ports(),
            models=[model],
            environment="test",
            broker=requested_broker(),
            extra_env=env,
        )
        # The twin: the same topics, database and group, its own health port and state dir.
        self.twin = replace(
            self.stack,
            state_dir=state_dir / "twin",
            ports=replace(self.stack.ports, inference=free_ports().inference),
            extra_env=twin_env,
        )
        self.client = OpenAI(
            base_url=self.stack.base_url, api_key=self.stack.api_key, max_retries=10, timeout=30
        )
        self.mongo: MongoClient[dict[str, Any]] = MongoClient(
            self.stack.env()["BATCHSTREAM_MONGO_URI"], serverSelectionTimeoutMS=2000, timeoutMS=3000
        )

    def start(self) -> None:
        self.stack.start(STAND_INS)
        self.stack.provision()
        self.stack.start([*SERVICES, self.worker])

    def close(self) -> None:
        self.mongo.close()
        self.twin.stop()
        self.stack.stop()

    # --- components by the names faults use
    def owner(self, component: str) -> tuple[Stack, str]:
        if component == "worker":
            return self.stack, self.worker
        if component == "twin":
            return self.twin, self.worker
        return self.stack, component

    def batch(self, batch_id: str) -> dict[str, Any] | None:
        """The batch document, or None while MongoDB does not answer."""
        try:
            return self.mongo[self.stack.mongo_database].batches.find_one({"_id": batch_id})
        except Exception:  # MongoDB may be the component just killed
            return None


def phase_of(doc: dict[str, Any] | None) -> str:
    if doc is None:
        return "unknown"
    status = doc["status"]
    if status == "in_progress":
        counts = doc.get("request_counts") or {}
        if not doc.get("emitted", False):
            return "emitting"
        return "running" if counts.get("completed", 0) + counts.get("failed", 0) else "emitted"
    return str(status)


def progress(doc: dict[str, Any] | None) -> tuple[str, int] | None:
    if doc is None:
        return None
    counts = doc.get("request_counts") or {}
    return doc["status"], counts.get("completed", 0) + counts.get("failed", 0)


_PHASE_ORDER = ["validating", "emitting", "emitted", "running", "finalizing", "completed"]


def reached(phase: str, doc: dict[str, Any] | None) -> bool:
    """The batch is in ``phase`` or past it (a fast batch may skip one between two looks)."""
    seen = phase_of(doc)
    if seen not in _PHASE_ORDER:
        return seen in TERMINAL
    return _PHASE_ORDER.index(seen) >= _PHASE_ORDER.index(phase)


def kill_tree(stack: Stack, name: str, sig: int = signal.SIGKILL) -> list[int]:
    """Send ``sig`` to the component's leader, its descendants and its process group."""
    pid = stack.pid(name)
    if pid is None:
        raise RuntimeError(f"{name} is not running")
    leader = psutil.Process(pid)
    procs = {leader, *leader.children(recursive=True), *group_members(pid)}
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.send_signal(sig)
    if sig == signal.SIGKILL:
        wait_until(lambda: not any(_alive(p) for p in procs), 10, f"{name}'s processes to die")
    return sorted(p.pid for p in procs)


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def restart(chaos: ChaosStack, fault: Fault) -> None:
    """Start the killed component again, as ``make up`` would."""
    if fault.component == "kafka":
        services = ["api", "aggregator", "inference"]
        if up(chaos.stack, services) != 0:
            raise RuntimeError("make up's path failed after the broker loss")
        if fault.twin:  # not used by the broker fault; kept for symmetry
            chaos.twin.start([chaos.worker])
        return
    stack, name = chaos.owner(fault.component)
    stack.start([name])


def run_trial(
    chaos: ChaosStack, fault: Fault, seed: int, lines: int, log: Callable[[str], None] = print
) -> TrialResult:
    rng = random.Random(seed)
    log(f"chaos trial fault={fault.name} seed={seed} lines={lines}: starting")
    began = time.monotonic()
    if fault.twin:
        chaos.twin.start([chaos.worker])
    try:
        return _trial(chaos, fault, seed, rng, lines, began, log)
    finally:
        if fault.twin:
            chaos.twin.stop([chaos.worker])


def _trial(
    chaos: ChaosStack,
    fault: Fault,
    seed: int,
    rng: random.Random,
    lines: int,
    began: float,
    log: Callable[[str], None],
) -> TrialResult:
    batch_id = submit_batch(chaos, lines, f"trial {seed}")
    wait_until(lambda: reached(fault.phase, chaos.batch(batch_id)), 120, f"phase {fault.phase}", 0.02)
    time.sleep(rng.uniform(0, fault.max_delay_s))  # the random moment (not an assertion wait)
    stack, name = chaos.owner(fault.component)
    phase_seen = phase_of(chaos.batch(batch_id))

    if fault.stall:
        recovery = _stall(chaos, stack, name, batch_id)
    else:
        kill_tree(stack, name)
        recovery = restart_and_time(chaos, batch_id, lambda: restart(chaos, fault))

    wait_until(lambda: phase_of(chaos.batch(batch_id)) in TERMINAL, 300, "a terminal status")
    result = check_batch(chaos, batch_id, lines)
    result = replace(
        result,
        fault=fault.name,
        seed=seed,
        phase_seen=phase_seen,
        recovery_s=recovery,
        seconds=time.monotonic() - began,
    )
    log(result.line())
    return result


def submit_batch(chaos: ChaosStack, lines: int, tag: str) -> str:
    """Upload ``lines`` chat lines (custom_ids ``c0`` .. ``cN-1``) and create a batch; its id."""
    requests = [chat_request(f"c{i}", MODEL, f"line {i} of {tag}") for i in range(lines)]
    upload = chaos.client.files.create(file=("chaos.jsonl", jsonl(requests)), purpose="batch")
    return chaos.client.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
    ).id


def restart_and_time(chaos: ChaosStack, batch_id: str, start_again: Callable[[], None]) -> float | None:
    """Call ``start_again`` (it brings the killed component back, as ``make up`` would); the
    recovery time runs from that call to the first progress seen once it has returned (the
    component is up again): counts above the lowest value seen since then, or another status. A
    batch that ends while the component starts (the broker's path restarts every service)
    recovered when it ended. None if it had ended before."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        restarted = time.monotonic()
        restarting = pool.submit(start_again)
        seen = progress(chaos.batch(batch_id))
        if seen is not None and seen[0] in TERMINAL:
            restarting.result()
            return None
        base: tuple[str, int] | None = None

        def moved() -> bool:
            nonlocal base
            now = progress(chaos.batch(batch_id))
            if now is None:
                return False
            if now[0] in TERMINAL:
                return True
            if not restarting.done():
                return False
            if base is None or (now[0] == base[0] and now[1] < base[1]):
                base = now  # the first look once it is back, or counts set back
                return False
            return now != base

        try:
            wait_until(moved, 300, "the batch's counts to move again", 0.05)
            return time.monotonic() - restarted
        finally:
            restarting.result()  # the component is back (or its start failed: that raises)


def _progress_now(chaos: ChaosStack, batch_id: str) -> tuple[str, int]:
    found = wait_until(lambda: progress(chaos.batch(batch_id)), 60, "MongoDB to answer")
    assert found is not None
    return found


def _stall(chaos: ChaosStack, stack: Stack, name: str, batch_id: str) -> float | None:
    """SIGSTOP the worker until the batch has ended without it (its partitions were rebalanced to
    the other worker, which runs its lines again), then SIGCONT: what it then publishes late is
    counted once. The time runs from the stop to the batch's end."""
    pids = kill_tree(stack, name, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        if _progress_now(chaos, batch_id)[0] in TERMINAL:
            return None
        wait_until(
            lambda: phase_of(chaos.batch(batch_id)) in TERMINAL,
            300,
            "the batch to end without the stalled worker",
        )
        return time.monotonic() - stopped
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


def check_batch(chaos: ChaosStack, batch_id: str, lines: int) -> TrialResult:
    """The batch ended ``completed`` with exact counts, every custom_id ``c0`` .. once, and
    nothing left in flight; what is wrong is in ``problems``."""
    problems: list[str] = []
    batch = chaos.client.batches.retrieve(batch_id)
    if batch.status != "completed":
        problems.append(f"status {batch.status}: {batch.errors}")
    seen = collections.Counter(
        rec["custom_id"]
        for file_id in (batch.output_file_id, batch.error_file_id)
        for rec in read_lines(chaos.client, file_id)
    )
    expected = {f"c{i}" for i in range(lines)}
    lost = len(expected - set(seen))
    duplicated = sum(n - 1 for n in seen.values() if n > 1)
    strangers = set(seen) - expected
    if lost or duplicated or strangers:
        problems.append(f"lost {lost}, duplicated {duplicated}, unknown {len(strangers)}")
    output = len(read_lines(chaos.client, batch.output_file_id))
    counts = batch.request_counts
    exact = counts is not None and (counts.total, counts.completed, counts.failed) == (
        lines,
        output,
        lines - output,
    )
    if not exact:
        problems.append(f"request_counts {counts} for {lines} lines, {output} in the output file")
    problems += _in_flight(chaos)
    return TrialResult("", 0, lines, "", lost, duplicated, exact, None, 0.0, problems)


def _in_flight(chaos: ChaosStack) -> list[str]:
    """Nothing running on a worker, no results waiting for the aggregator (within 30 s)."""
    stack = chaos.stack
    worker_metrics = f"http://127.0.0.1:{stack.ports.inference}/metrics"
    health = f"http://127.0.0.1:{stack.ports.aggregator}/health"

    def idle() -> bool:
        with contextlib.suppress(OSError, ValueError, KeyError):
            if metric_value(worker_metrics, "batchstream_inference_in_flight") != 0:
                return False
            with urllib.request.urlopen(health, timeout=5) as response:
                backlog = json.loads(response.read())["backlog"]
            return bool(backlog) and not any(backlog.values())
        return False

    try:
        wait_until(idle, 30, "nothing in flight", 0.2)
    except TimeoutError as exc:
        return [str(exc)]
    return []


def spread(trials: int, faults: list[str], seed: int) -> Iterator[tuple[str, int]]:
    """``trials`` (fault, seed) pairs, the faults in turn, each seed drawn from ``seed``."""
    rng = random.Random(seed)
    for n in range(trials):
        yield faults[n % len(faults)], rng.randrange(1, 2**31)


def summary(results: list[TrialResult]) -> str:
    """Trials per fault, lines checked, lost, duplicated, failed, recovery p50/max."""
    rows = ["fault                 trials  lines  lost  dup  failed  recovery p50  max"]
    by_fault: dict[str, list[TrialResult]] = collections.defaultdict(list)
    for r in results:
        by_fault[r.fault].append(r)
    for name, rs in [*sorted(by_fault.items()), ("all", results)]:
        rec = sorted(r.recovery_s for r in rs if r.recovery_s is not None)
        p50 = f"{statistics.median(rec):.1f}s" if rec else "n/a"
        top = f"{rec[-1]:.1f}s" if rec else "n/a"
        rows.append(
            f"{name:<21} {len(rs):>6} {sum(r.lines for r in rs):>6} {sum(r.lost for r in rs):>5} "
            f"{sum(r.duplicated for r in rs):>4} {sum(not r.ok for r in rs):>7} {p50:>13} {top:>5}"
        )
    return "\n".join(rows)
