"""Process control through psutil: start a command detached, tell if it still runs, stop its tree.

Every component runs in its own session and process group (``start_new_session``), with its output
appended to a log file. A process is named by a ``ProcessRef``: its PID and when it started (seconds
after boot), so a PID the kernel gave to another process since is never taken for ours.
"""

from __future__ import annotations

import contextlib
import datetime
import math
import os
import signal
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from deploy.local.errors import StackError
from deploy.local.probes import poll_until

# Popen handles of what this process started, so their exit is collected (no zombies left).
_spawned: dict[int, subprocess.Popen[bytes]] = {}


# A PID file's start time: seconds after boot. An older stack wrote psutil's wall-clock creation
# time without this mark; it is converted as it is read.
_SINCE_BOOT = "boot+"


@dataclass(frozen=True)
class ProcessRef:
    """A process we started: its PID and its start in seconds after boot (None: not known, not
    checked)."""

    pid: int
    started: float | None = None

    def dumps(self) -> str:
        return f"{self.pid}\n" + (f"{_SINCE_BOOT}{self.started}\n" if self.started is not None else "")

    @classmethod
    def loads(cls, text: str) -> ProcessRef | None:
        """A PID file's content. An older stack's wall-clock start time (``1764580000.25``) is
        converted with the boot time as the clock says now, as that stack compared it; one
        without a fraction, or unreadable, is not checked."""
        words = text.split()
        if not words or not words[0].isdigit():
            return None
        stamp = words[1] if len(words) > 1 else ""
        try:
            if stamp.startswith(_SINCE_BOOT):
                started: float | None = float(stamp.removeprefix(_SINCE_BOOT))
            elif "." in stamp:
                started = float(stamp) - psutil.boot_time()
            else:
                started = None
        except ValueError:
            started = None
        if started is not None and not math.isfinite(started):
            started = None
        return cls(int(words[0]), started)


def started_after_boot(proc: psutil.Process) -> float:
    """Seconds from boot to ``proc``'s start.

    Not psutil's public ``create_time()`` alone: that adds the boot time, read from the wall clock
    at each call, so it moves by however much the system clock is set (NTP, a resumed VM or
    sandbox). A stack that compared it to the value of its start took every one of its processes
    for a stranger after such a step, reported a healthy worker as exited and left them all
    running. On Linux the start is read once, in clock ticks since boot: psutil's monotonic
    reading, the one it identifies processes by (``Process._get_ident``; psutil 7.2 as locked).
    Elsewhere (where psutil's "monotonic" reading is an epoch time too) the two public readings are
    subtracted, which a clock step between them would still upset.
    """
    if psutil.LINUX:
        return float(proc._proc.create_time(monotonic=True))
    return float(proc.create_time() - psutil.boot_time())


def resume(ref: ProcessRef) -> None:
    """SIGCONT to the process group of ``ref`` if it is still ours: a stopped (SIGSTOP) group acts
    on a SIGTERM only once continued."""
    if _process(ref) is not None:
        with contextlib.suppress(OSError):
            os.killpg(ref.pid, signal.SIGCONT)


def spawn_detached(argv: Sequence[str], env: Mapping[str, str], cwd: Path, log_path: Path) -> ProcessRef:
    """Start ``argv`` in a new session, stdin closed, stdout and stderr appended to ``log_path``."""
    with log_path.open("ab") as log:
        stamp = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        log.write(f"\n=== {stamp} start: {' '.join(argv)}\n".encode())
        log.flush()
        proc = subprocess.Popen(
            list(argv),
            env=dict(env),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    _spawned[proc.pid] = proc
    try:
        started: float | None = started_after_boot(psutil.Process(proc.pid))
    except psutil.Error:
        started = None  # already gone: is_running will say so
    return ProcessRef(proc.pid, started)


def _process(ref: ProcessRef) -> psutil.Process | None:
    """The running (not zombie) process ``ref`` names, or None."""
    try:
        proc = psutil.Process(ref.pid)
        if ref.started is not None and abs(started_after_boot(proc) - ref.started) > 0.01:
            return None  # the PID now belongs to another process
        if proc.status() != psutil.STATUS_ZOMBIE:
            return proc
    except psutil.Error:
        pass
    popen = _spawned.get(ref.pid)
    if popen is not None and popen.poll() is not None:  # ours and exited: collect its status
        del _spawned[ref.pid]
    return None


def is_running(ref: ProcessRef) -> bool:
    """True if the process exists, is not a zombie and is the one we started."""
    return _process(ref) is not None


def command_line(ref: ProcessRef) -> list[str]:
    """The command line of the process ``ref`` names while it runs ([] otherwise, or unreadable)."""
    proc = _process(ref)
    try:
        return proc.cmdline() if proc is not None else []
    except psutil.Error:
        return []


def environment(ref: ProcessRef) -> dict[str, str]:
    """The environment of the process ``ref`` names while it runs ({} otherwise, or unreadable)."""
    proc = _process(ref)
    try:
        return dict(proc.environ()) if proc is not None else {}
    except psutil.Error:
        return {}


def wait_exit(ref: ProcessRef, timeout_s: float) -> int | None:
    """The exit status of a process this process started, once it has exited (None if it is not
    one of ours); ``subprocess.TimeoutExpired`` if it still runs after ``timeout_s``."""
    popen = _spawned.get(ref.pid)
    if popen is None:
        return None
    status = popen.wait(timeout=timeout_s)
    del _spawned[ref.pid]
    return status


def _pid_taken(pid: int) -> bool:
    """Whether some (other) live process holds ``pid``."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def group_members(pgid: int, known: Iterable[psutil.Process] = ()) -> list[psutil.Process]:
    """Live processes of the process group ``pgid``, plus any of ``known`` still alive."""
    found = {p for p in known if _alive(p)}
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):
            if os.getpgid(proc.pid) == pgid and _alive(proc):
                found.add(proc)
    return sorted(found, key=lambda p: p.pid)


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def stop_tree(ref: ProcessRef, timeout_s: float) -> None:
    """SIGTERM the leader, wait for its tree and process group to end, then SIGKILL what is left.

    Only the leader gets SIGTERM, as ``docker stop`` and Kubernetes do: a draining inference worker
    still needs its vLLM engine process, which it shuts down itself once drained.
    """
    leader = _process(ref)
    if leader is None and _pid_taken(ref.pid):
        # The PID belongs to another process now; the kernel never reuses a PID while a process
        # group of that id exists, so our group is gone.
        return
    tree: list[psutil.Process] = []
    if leader is not None:
        with contextlib.suppress(psutil.Error):
            tree = [leader, *leader.children(recursive=True)]
        with contextlib.suppress(psutil.Error):
            leader.terminate()
        resume(ref)  # a stopped (SIGSTOP) group acts on its SIGTERM too
        poll_until(lambda: not _left(ref, tree), timeout_s, interval_s=0.1)
    # SIGKILL what is left (if the leader died first, its children may not have), again on each
    # look, so a process forked meanwhile goes too.
    if not poll_until(lambda: not _kill(_left(ref, tree)), 5.0, interval_s=0.05):
        raise StackError(f"process group {ref.pid} survived SIGKILL")
    popen = _spawned.pop(ref.pid, None)
    if popen is not None:
        popen.wait(timeout=5)  # it has exited: collect its status so no zombie is left


def _left(ref: ProcessRef, tree: list[psutil.Process]) -> list[psutil.Process]:
    _process(ref)  # collects the leader's exit status if we started it
    return group_members(ref.pid, tree)


def _kill(procs: list[psutil.Process]) -> list[psutil.Process]:
    """SIGKILL each of ``procs``; returns them (empty: nothing was left)."""
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    return procs
