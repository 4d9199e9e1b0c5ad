"""Stand-in servers of a test's own, apart from the session's: for tests that kill, restart or
put a proxy in front of one (the session's servers are shared by every other test).

- ``PrivateMongo``: SecantusDB on a port and data dir of the test's; ``stop`` is a SIGKILL.
- ``private_tansu``: a Tansu broker (memory store), optionally advertising another port (a proxy's).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from deploy.local.catalogue import tansu_binary
from deploy.local.probes import tcp_ready
from tests.support.waiting import wait_until


class PrivateMongo:
    """A MongoDB-wire server that a test starts, SIGKILLs and starts again on the same data."""

    def __init__(self, port: int, path: Path) -> None:
        self.port, self.path = port, path
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        server = os.path.join(os.path.dirname(sys.executable), "secantusd-py")
        command = [server, "--host", "127.0.0.1", "--port", str(self.port), "--storage-path", str(self.path)]
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(tcp_ready(self.port), 30, "the private MongoDB")

    def stop(self) -> None:
        """SIGKILL: no shutdown, as in a crash."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()


@contextmanager
def private_tansu(port: int, advertised_port: int | None = None) -> Iterator[None]:
    """A Tansu broker listening on ``port`` and telling clients to connect to ``advertised_port``
    (default: ``port``) while the block runs."""
    advertised = advertised_port or port
    command = [str(tansu_binary()), "broker", "--listener-url", f"tcp://127.0.0.1:{port}"]
    command += ["--advertised-listener-url", f"tcp://127.0.0.1:{advertised}"]
    command += ["--storage-engine", "memory://tansu/"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield
    finally:
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
