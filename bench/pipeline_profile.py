"""The pipeline ceiling's ``--profile``: py-spy recording one service, and its hottest functions."""

from __future__ import annotations

import collections
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any


class Profiler:
    """py-spy recording one PID until stopped (SIGINT makes py-spy write its output)."""

    def __init__(self, pid: int, out: Path) -> None:
        exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
        if not Path(exe).exists():
            raise SystemExit("--profile needs py-spy (pip install py-spy==0.4.3 into this environment)")
        self.out = out
        argv = [exe, "record", "-p", str(pid), "-r", "100", "-f", "raw", "-o", str(out), "--nonblocking"]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def stop(self) -> list[tuple[str, int]]:
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        return parse_collapsed(self.out) if self.out.exists() else []


def parse_collapsed(path: Path) -> list[tuple[str, int]]:
    stacks = []
    for line in path.read_text().splitlines():
        frames, _, count = line.rpartition(" ")
        if count.isdigit():
            stacks.append((frames, int(count)))
    return stacks


def _func(frame: str) -> str:
    """'fn (path/to/file.py:12)' -> 'fn (to/file.py)': line numbers dropped, path shortened."""
    name, _, where = frame.partition(" (")
    where = where.rstrip(")").rsplit(":", 1)[0]
    for marker in ("site-packages/", "/work/", "python3.11/"):
        if marker in where:
            where = where.split(marker, 1)[1]
    return f"{name} ({where})" if where else name


def profile_summary(stacks: list[tuple[str, int]], top: int = 15) -> dict[str, Any]:
    total = sum(c for _, c in stacks) or 1
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    idle = 0
    for frames, count in stacks:
        parts = [_func(f) for f in frames.split(";")[1:]]  # the first is the thread
        if not parts:
            continue
        leaf = parts[-1]
        if any(w in leaf for w in ("select (", "poll (", "epoll", "_run_once", "wait (")):
            idle += count
        own[leaf] += count
        for name in set(parts):
            inclusive[name] += count
    return {
        "samples": total,
        "idle_share": idle / total,
        "self": [(n, c / total) for n, c in own.most_common(top)],
        "inclusive": [(n, c / total) for n, c in inclusive.most_common(top * 3)],
    }
