"""The local stack survives its own restarts, done the way a user does them.

On Tansu the broker keeps its data in memory, so both cases lose every message of a batch in
flight: ``up`` then resumes the batch from the results stored in its chunks, and only its lines
without a result run again. noida-db (``BATCHSTREAM_TEST_BROKER=noida``) keeps its data, and ``up``
handles its restart the same way. Each case ends with the batch ``completed``, exact
``request_counts``, every custom_id once, nothing in flight, every component alive and healthy,
and a new batch completing. Each prints its recovery times: from the ``up`` call to the batch's
counts moving again.

The stacks are ``tests/chaos`` stacks (own stand-ins, api, aggregator, a fake-engine worker, on
free ports in a tmp dir), and the kills and checks are the chaos trials' own.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from deploy.local import up
from deploy.local.probes import metric_value
from tests.chaos.trials import (
    MODEL,
    ChaosStack,
    check_batch,
    kill_tree,
    phase_of,
    progress,
    restart_and_time,
    submit_batch,
)
from tests.support.waiting import TERMINAL, wait_until

pytestmark = pytest.mark.e2e
LINES = 3000
# The fake engine paced (0.05 s a request, 16 at once: at most 320 lines/s), so the batch is still
# running when the test kills or stops the stack, however fast the machine: a rerun takes the
# worker 9 s or more, and the restarted aggregator's first counts came with up to 1,296 lines done
# (2-core machine, load average 12).
PACED = {"BATCHSTREAM_INFERENCE_FAKE_SECONDS_PER_TOKEN": "0.05", "BATCHSTREAM_INFERENCE_MAX_IN_FLIGHT": "16"}
KILLS = 3
# Each kill resumes the batch where its stored results end, and about 1,600 lines ran between one
# kill and the next (2026-12-06): the batch must outlast three of them.
KILL_LINES = 6000
IN_PROGRESS = {"emitting", "emitted", "running"}  # phase_of's names for an in_progress batch


@pytest.fixture
def chaos(tmp_path: Path) -> Iterator[ChaosStack]:
    """A stack of its own (paced), not started; every process it ends up with is stopped by PID."""
    stack = ChaosStack(tmp_path)
    stack.stack.extra_env.update(PACED)
    try:
        yield stack
    finally:
        stack.close()


def test_a_batch_completes_exactly_once_when_the_broker_is_killed_three_times(chaos: ChaosStack) -> None:
    chaos.start()
    warm_up(chaos)
    batch_id = submit_batch(chaos, KILL_LINES, "broker kills")
    wait_counting(chaos, batch_id)
    for kill in range(1, KILLS + 1):
        kill_tree(chaos.stack, "kafka")  # SIGKILL to the broker's process group
        killed_at = progress(chaos.batch(batch_id))
        print(f"broker kill {kill}/{KILLS} at {killed_at} of {KILL_LINES} lines")
        assert phase_of(chaos.batch(batch_id)) in IN_PROGRESS, (
            f"kill {kill} after the batch's end (raise LINES)"
        )
        recovery = restart_and_time(chaos, batch_id, lambda: make_up(chaos))
        assert recovery is not None
        print(f"broker kill {kill}/{KILLS}: recovery {recovery:.1f} s (from up to the counts moving)")
    assert_batch_exact(chaos, batch_id, KILL_LINES)
    assert_nothing_stuck(chaos)


def test_make_down_then_make_up_mid_batch_completes_each_line_once(chaos: ChaosStack) -> None:
    state_dir = chaos.stack.state_dir
    up_args = [
        "up",
        "--model",
        f"={MODEL}",
        "--engine",
        "fake",
        *port_args(chaos),
        "--broker",
        chaos.stack.broker,
        "--state-dir",
        str(state_dir),
    ]
    deploy_local(chaos, *up_args)
    warm_up(chaos)
    batch_id = submit_batch(chaos, LINES, "down and up")
    wait_counting(chaos, batch_id)
    before = progress(chaos.batch(batch_id))
    counted = before[1] if before else 0  # lines answered by the down: at least these

    began = time.monotonic()
    deploy_local(chaos, "down", "--state-dir", str(state_dir))
    print(f"down at {counted} of {LINES} lines counted took {time.monotonic() - began:.1f} s")
    assert chaos.stack.pids() == {}, "down left processes running"

    said: list[str] = []
    recovery = restart_and_time(chaos, batch_id, lambda: said.append(deploy_local(chaos, *up_args)))
    assert recovery is not None
    assert batch_id in said[0], f"up did not resume the batch (it had ended before down):\n{said[0]}"
    print(f"down, then up: recovery {recovery:.1f} s (from up to the counts moving)")
    assert_batch_exact(chaos, batch_id, LINES)
    # Nothing answered ran again: the restarted worker ran at most the lines without a result at
    # the down (those in flight then included).
    ran = metric_value(
        f"http://127.0.0.1:{chaos.stack.ports.inference}/metrics", "batchstream_inference_requests_total"
    )
    print(f"after up the worker ran {ran:.0f} lines; {LINES - counted} had no counted result at the down")
    assert 0 < ran <= LINES - counted
    assert_nothing_stuck(chaos)


# ---------------------------------------------------------------------------------- helpers


def warm_up(chaos: ChaosStack) -> None:
    """A small batch first: once it completes, the worker and the aggregator have joined their
    groups, so the test batch's counts move from its first lines on (its kills land early)."""
    assert_batch_exact(chaos, submit_batch(chaos, 20, "warm-up"), 20)


def make_up(chaos: ChaosStack) -> None:
    """What ``make up`` runs (``deploy.local.supervisor.up``), on this test's stack."""
    assert up(chaos.stack, ["api", "aggregator", "inference"]) == 0, "up failed"


def deploy_local(chaos: ChaosStack, *args: str) -> str:
    """``python -m deploy.local ARGS`` as ``make up``/``make down`` run it, on this test's stack;
    what it printed."""
    done = subprocess.run(
        [sys.executable, "-m", "deploy.local", *args],
        env=chaos.stack.service_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"deploy.local {args[0]} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def wait_counting(chaos: ChaosStack, batch_id: str) -> int:
    """Wait for the batch's first counted results (it is then mid-way); how many there are."""

    def counted() -> int:
        now = progress(chaos.batch(batch_id))
        assert now is None or now[0] in {"validating", "in_progress"}, f"the batch is {now[0]} already"
        return now[1] if now else 0

    return wait_until(counted, 60, "the first results counted")


def port_args(chaos: ChaosStack) -> list[str]:
    """``--port NAME=N`` for each of the stack's ports (none is ``make up``'s)."""
    ports = dataclasses.asdict(chaos.stack.ports)
    return [arg for name, port in ports.items() for arg in ("--port", f"{name}={port}")]


def assert_batch_exact(chaos: ChaosStack, batch_id: str, lines: int) -> None:
    """``completed``, exact counts, each custom_id once, nothing in flight."""
    wait_until(lambda: phase_of(chaos.batch(batch_id)) in TERMINAL, 120, "the batch's end")
    result = check_batch(chaos, batch_id, lines)
    assert result.ok, result.problems


def assert_nothing_stuck(chaos: ChaosStack) -> None:
    """Every component alive and healthy (``/health`` 200 for the services), and a new batch
    completes."""
    states = chaos.stack.status()
    assert set(states) == set(chaos.stack.components()), states
    assert all(state.startswith("healthy") for state in states.values()), states
    batch_id = submit_batch(chaos, 20, "after the restarts")
    assert_batch_exact(chaos, batch_id, 20)
