"""An OpenAI-compatible model server as a child process on a free port: ``start`` (and wait until
it answers ``/health``), ``kill``, and ``start`` again on the same port (a server restarted
mid-batch). ``vllm_serve.VllmServer`` runs a real ``vllm serve``; ``bench.sim_server.SimServer``
the simulated GPU behind the same surface.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from deploy.local.errors import StackError
from deploy.local.ports import free_port
from deploy.local.probes import http_ready, wait_ready


class ModelServer:
    """``argv(port)`` serving ``served_name`` on 127.0.0.1, its process group owned here and its
    output appended to ``log``."""

    def __init__(
        self,
        name: str,
        argv: Callable[[int], Sequence[str]],
        served_name: str,
        max_num_seqs: int,
        *,
        env: Mapping[str, str] | None = None,
        start_timeout_s: float,
    ) -> None:
        self.name = name
        self.served_name = served_name
        self.max_num_seqs = max_num_seqs
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.argv = list(argv(self.port))
        self.env = dict(env) if env is not None else None
        self.start_timeout_s = start_timeout_s
        self.log = Path(tempfile.mkdtemp(prefix=f"batchstream-{name.replace(' ', '-')}-")) / "serve.log"
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def start(self) -> None:
        """Start the server and wait until it answers ``/health``; ``StackError`` with the end of
        its log when it does not."""
        with self.log.open("ab") as out:
            self._process = subprocess.Popen(
                self.argv, stdout=out, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
            )
        state = wait_ready(http_ready(f"{self.url}/health"), lambda: self.running, self.start_timeout_s)
        if state != "ready":
            self.kill()
            end = self.log.read_text(errors="replace")[-4000:]
            raise StackError(f"{self.name} {state}; the end of its log:\n{end}")

    def kill(self, sig: signal.Signals = signal.SIGKILL) -> None:
        """Stop the server and every process it started (their own process group): ``sig``, then
        SIGKILL for what is left after 30 s."""
        process, self._process = self._process, None
        if process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
