"""The local stack's process control on real processes: what it starts, it stops, leaving nothing."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from pathlib import Path

import psutil
import pytest

from deploy.local.catalogue import ModelSpec
from deploy.local.processes import (
    ProcessRef,
    group_members,
    is_running,
    spawn_detached,
    started_after_boot,
    stop_tree,
    wait_exit,
)
from tests.support.waiting import wait_until


def test_a_tree_that_ignores_sigterm_is_killed_to_the_last_process(tmp_path: Path) -> None:
    log = tmp_path / "tree.log"
    # bash and its sleep both ignore SIGTERM (an ignored signal stays ignored across exec).
    ref = spawn_detached(["bash", "-c", "trap '' TERM; sleep 300 & wait"], os.environ, tmp_path, log)
    leader = psutil.Process(ref.pid)
    children = wait_until(lambda: leader.children(recursive=True), 10, "the child sleep")
    assert is_running(ref)

    started = time.monotonic()
    stop_tree(ref, timeout_s=0.5)

    assert time.monotonic() - started < 5
    assert not is_running(ref)
    assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in [leader, *children])
    assert group_members(ref.pid) == []
    assert "start: bash -c" in log.read_text()


def test_a_leader_that_exits_on_sigterm_is_stopped_at_once(tmp_path: Path) -> None:
    ref = spawn_detached(["sleep", "300"], os.environ, tmp_path, tmp_path / "sleep.log")
    started = time.monotonic()
    stop_tree(ref, timeout_s=30)
    assert time.monotonic() - started < 5
    assert not is_running(ref)


def test_a_stopped_process_still_gets_to_handle_its_sigterm(tmp_path: Path) -> None:
    # A frozen stack (SIGSTOP, as the versus bench does to the side at rest) acts on SIGTERM only
    # once continued: stop_tree continues it, so it shuts down cleanly instead of being killed.
    done = tmp_path / "clean-exit"
    program = (
        "import pathlib, signal, sys, time\n"
        f"signal.signal(signal.SIGTERM, lambda *_: (pathlib.Path({str(done)!r}).touch(), sys.exit(0)))\n"
        "print('handler', 'installed', flush=True)\n"  # the log's start line holds the program text
        "time.sleep(300)\n"
    )
    log = tmp_path / "handler.log"
    ref = spawn_detached([sys.executable, "-c", program], os.environ, tmp_path, log)
    try:
        wait_until(lambda: "handler installed" in log.read_text(), 30, "the handler to be installed")
        os.killpg(ref.pid, signal.SIGSTOP)
        stop_tree(ref, timeout_s=20)
        assert done.exists(), "the stopped process was killed rather than left to handle its SIGTERM"
        assert not is_running(ref)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(ref.pid, signal.SIGKILL)


def test_the_exit_status_of_a_process_we_started_is_known(tmp_path: Path) -> None:
    ref = spawn_detached(["bash", "-c", "exit 3"], os.environ, tmp_path, tmp_path / "exit.log")
    assert wait_exit(ref, 10) == 3
    assert not is_running(ref)
    assert wait_exit(ProcessRef(os.getpid()), 1) is None  # not started by us


def test_a_pid_now_held_by_another_process_is_not_ours() -> None:
    me = psutil.Process()
    assert is_running(ProcessRef(me.pid, started_after_boot(me)))
    assert not is_running(ProcessRef(me.pid, started_after_boot(me) - 100))
    stop_tree(ProcessRef(me.pid, started_after_boot(me) - 100), timeout_s=1)  # leaves this process alone
    assert me.is_running()


def test_our_processes_stay_ours_and_stoppable_when_the_wall_clock_is_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A fake clock step: psutil reads the boot time from the wall clock at each call, so setting the
    # clock (NTP, a resumed VM) moves it, and every creation time with it, while the processes run on.
    ref = spawn_detached(["sleep", "300"], os.environ, tmp_path, tmp_path / "sleep.log")
    boot = psutil.boot_time()
    monkeypatch.setattr(psutil._psplatform, "boot_time", lambda: boot + 3600)
    try:
        assert psutil.Process(ref.pid).create_time() > time.time() + 3000  # the step is seen
        assert is_running(ref)
        stop_tree(ref, timeout_s=10)
        assert not is_running(ref)
        assert group_members(ref.pid) == []
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(ref.pid, signal.SIGKILL)  # whatever the outcome, nothing is left running


def test_pid_files_round_trip_and_older_ones_are_read() -> None:
    ref = ProcessRef(1234, 52001.25)
    assert ProcessRef.loads(ref.dumps()) == ref
    assert ProcessRef.loads(ProcessRef(1234).dumps()) == ProcessRef(1234, None)
    # An older stack's wall-clock creation time is still checked: this process's is ours, an
    # earlier one is not.
    me = psutil.Process()
    older = ProcessRef.loads(f"{me.pid}\n{me.create_time()}\n")
    assert older is not None and is_running(older)
    earlier = ProcessRef.loads(f"{me.pid}\n{me.create_time() - 100}\n")
    assert earlier is not None and not is_running(earlier)
    # Whole seconds (the oldest stacks) and unreadable stamps are not checked.
    for stamp in ("98765", "boot+", "boot+x", "boot+nan", "1.2.3"):
        assert ProcessRef.loads(f"1234\n{stamp}\n") == ProcessRef(1234, None), stamp
    assert ProcessRef.loads("") is None


def test_model_specs_parse_as_make_up_writes_them() -> None:
    spec = ModelSpec.parse(".cache/models/minilm=all-MiniLM-L6-v2:pooling")
    assert spec == ModelSpec(".cache/models/minilm", "all-MiniLM-L6-v2", runner="pooling")
    assert spec.component == "inference-all-MiniLM-L6-v2"
    assert ModelSpec.parse(".cache/models/tiny-llama").served_name == "tiny-llama"


def test_remote_model_specs_name_a_server_and_refuse_anything_else() -> None:
    spec = ModelSpec.parse_remote("llama-8b=http://10.0.0.5:8000/v1")
    assert (spec.served_name, spec.remote_url, spec.engine, spec.runner) == (
        "llama-8b",
        "http://10.0.0.5:8000/v1",
        "remote",
        "generate",
    )
    assert spec.component == "inference-llama-8b"
    embed = ModelSpec.parse_remote("e5=http://embed:8000:pooling")
    assert (embed.remote_url, embed.runner) == ("http://embed:8000", "pooling")
    for bad in ("llama-8b", "=http://h:1", "llama-8b=h:8000", "llama-8b=ftp://h"):
        with pytest.raises(ValueError, match="NAME=URL"):
            ModelSpec.parse_remote(bad)
